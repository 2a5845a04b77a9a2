"""Print the top-k classes from a Cuvil executable's JSON output, one per line."""
from __future__ import annotations

import json
import sys


def main(path: str, image: str = "") -> int:
    with open(path, encoding="utf-8") as f:
        result = json.load(f)
    top = result["top_k"]
    print(f"{image or path}: {top[0]['label']} (class {top[0]['index']}, score {top[0]['score']:.3f})")
    for entry in top[1:]:
        print(f"    then {entry['label']} ({entry['score']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
