"""The standalone executable: .npy and JSON outputs against torch, the command line, and
bad input (each case: the one stderr line, the exit code, and no output file)."""
from __future__ import annotations

import copy
import io
import json
import zlib

import numpy as np
import pytest
from PIL import Image

from cuvil.native import link_artifact

from .helpers import CNN_LABELS, close, run_c


def _npy_bytes(arr: np.ndarray, **kw) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, **kw)
    return buf.getvalue()


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max())
    return e / e.sum()


def test_npy_in_npy_out_matches_torch(cnn, tmp_path):
    exe = cnn.artifact("exe")
    (x,) = cnn.random_inputs(10)
    np.save(tmp_path / "x.npy", x)
    outs = []
    for threads in ("1", "4"):
        proc = run_c(exe, "--input", tmp_path / "x.npy", "--output", tmp_path / f"y{threads}.npy", "--threads", threads)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        outs.append(np.load(tmp_path / f"y{threads}.npy"))
    (ref,) = cnn.reference(x)
    assert outs[0].dtype == np.float32 and close(outs[0], ref)
    assert np.array_equal(outs[0], outs[1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy", "y1.npy", "y4.npy"]  # no temp files left


def test_classification_json(cnn, tmp_path):
    exe = cnn.artifact("exe")
    (x,) = cnn.random_inputs(11)
    np.save(tmp_path / "x.npy", x)
    (logits,) = cnn.reference(x)
    probs = _softmax(logits[0])
    proc = run_c(exe, "--input", f"x={tmp_path / 'x.npy'}", "--output", tmp_path / "top.json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "top.json").read_text(encoding="utf-8"))
    assert set(doc) == {"top_k"}
    order = np.argsort(-probs, kind="stable")[:3]
    assert [e["index"] for e in doc["top_k"]] == order.tolist()
    assert [e["label"] for e in doc["top_k"]] == [CNN_LABELS[i] for i in order]
    np.testing.assert_allclose([e["score"] for e in doc["top_k"]], probs[order], rtol=1e-5)

    proc = run_c(exe, "--input", tmp_path / "x.npy", "--output", tmp_path / "all.json", "--logits")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "all.json").read_text(encoding="utf-8"))
    assert set(doc) == {"top_k", "logits"} and close(np.array(doc["logits"], np.float32), logits[0])


def test_all_labels_raw_scores(cnn, tmp_path):
    """top_k = all classes without softmax: every label (quotes, backslash, tab, UTF-8,
    '??', '*/') survives the C tables and JSON escaping, and scores are the logits."""
    manifest = copy.deepcopy(cnn.manifest)
    manifest["postprocess"]["output"].update(top_k=50, softmax=False)
    exe = link_artifact("exe", cnn.objects, manifest, None, tmp_path / "all_labels")
    (x,) = cnn.random_inputs(13)
    np.save(tmp_path / "x.npy", x)
    proc = run_c(exe, "--input", tmp_path / "x.npy", "--output", tmp_path / "o.json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "o.json").read_text(encoding="utf-8"))
    (logits,) = cnn.reference(x)
    assert len(doc["top_k"]) == 10
    assert {e["index"]: e["label"] for e in doc["top_k"]} == dict(enumerate(CNN_LABELS))
    scores = [e["score"] for e in doc["top_k"]]
    assert scores == sorted(scores, reverse=True)
    np.testing.assert_allclose(scores, np.sort(logits[0])[::-1], rtol=0, atol=1e-5 * np.abs(logits).max())


def test_two_inputs_two_outputs_json(two, tmp_path):
    exe = two.artifact("exe")
    x, y = two.random_inputs(12)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    refs = two.reference(x, y)
    for args in (["--input", tmp_path / "x.npy", "--input", tmp_path / "y.npy"],
                 ["--input", f"y={tmp_path / 'y.npy'}", "--input", f"x={tmp_path / 'x.npy'}"]):
        proc = run_c(exe, *args, "--output", tmp_path / "out.json")
        assert proc.returncode == 0, proc.stderr
        doc = json.loads((tmp_path / "out.json").read_text())
        assert [o["name"] for o in doc["outputs"]] == [t["name"] for t in two.manifest["outputs"]]
        for o, ref in zip(doc["outputs"], refs):
            assert o["dtype"] == "f32" and o["shape"] == list(ref.shape)
            assert close(np.array(o["data"], np.float32).reshape(ref.shape), ref)
    proc = run_c(exe, *args, "--output", tmp_path / "out.npy")
    assert proc.returncode == 2 and "a .npy file holds one" in proc.stderr


def test_help(cnn):
    proc = run_c(cnn.artifact("exe"), "--help")
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout.startswith("usage: tiny_cnn --input FILE")
    assert "x                f32[1, 3, 16, 16]  or a JPEG/PNG image" in proc.stdout
    assert "classification, top 3" in proc.stdout


def _one_line(proc, prog: str) -> str:
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(prog + ": "), proc.stderr
    assert proc.stdout == ""
    return lines[0]


USAGE = [
    ([], "missing --input for 'x'"),
    (["--input", "{x}"], "--output FILE.json or FILE.npy is required"),
    (["--input", "{x}", "--output", "{out}.txt"], "must end in .json or .npy"),
    (["--input", "{x}", "--input", "{x}", "--output", "{out}.json"], "too many --input options"),
    (["--input", "x={x}", "--input", "x={x}", "--output", "{out}.json"], "input 'x' given twice"),
    (["--input", "{x}", "--output", "{out}.json", "--threads", "0"], "--threads must be an integer from 1 to 256"),
    (["--input", "{x}", "--output", "{out}.json", "--threads", "4x"], "got '4x'"),
    (["--input", "{x}", "--output", "{out}.json", "--frobnicate"], "unknown argument '--frobnicate'"),
    (["--input", "{x}", "--output"], "--output needs a value"),
    (["--input", "{x}", "--output", "{out}.json", "--output", "{out}.npy"], "--output given twice"),
]


@pytest.mark.parametrize("args,phrase", USAGE)
def test_usage_errors_exit_2(cnn, tmp_path, args, phrase):
    np.save(tmp_path / "x.npy", cnn.random_inputs(0)[0])
    out = tmp_path / "out"
    proc = run_c(cnn.artifact("exe"), *(a.format(x=tmp_path / "x.npy", out=out) for a in args))
    assert proc.returncode == 2
    line = _one_line(proc, "tiny_cnn")
    assert phrase in line and line.endswith("(see tiny_cnn --help)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy"]


def _good_png() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _good_jpeg() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


def _bad_png_crc() -> bytes:
    data = bytearray(_good_png())
    idat = data.index(b"IDAT")
    length = int.from_bytes(data[idat - 4:idat], "big")
    data[idat + 4 + length] ^= 0xFF  # the IDAT chunk's stored CRC
    return bytes(data)


def _huge_png() -> bytes:
    data = bytearray(_good_png())
    data[16:24] = (100000).to_bytes(4, "big") + (100000).to_bytes(4, "big")  # IHDR width, height
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


def _huge_jpeg() -> bytes:
    data = bytearray(_good_jpeg())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = (60000).to_bytes(2, "big") * 2  # height, width
    return bytes(data)


def _bad_inputs():
    good = np.zeros((1, 3, 16, 16), np.float32)
    npy = _npy_bytes(good)
    header_len = len(_npy_bytes(np.zeros((1, 3, 16, 16), np.float32))) - good.nbytes
    big_endian = _npy_bytes(good.astype(">f4"))
    fortran = _npy_bytes(np.asfortranarray(np.zeros((1, 3, 16, 16), np.float32).transpose(0, 1, 3, 2)))
    return [
        ("missing", None, "cannot open the file: No such file or directory"),
        ("directory", "DIR", "is a directory, not a file"),
        ("wrong_shape.npy", _npy_bytes(np.zeros((1, 3, 8, 8), np.float32)),
         "shape (1, 3, 8, 8) does not match the model's [1, 3, 16, 16]"),
        ("wrong_rank.npy", _npy_bytes(np.zeros((3, 16, 16), np.float32)), "shape (3, 16, 16) does not match"),
        ("wrong_dtype.npy", _npy_bytes(good.astype(np.float64)), "dtype f64 ('<f8') does not match the model's f32"),
        ("int_dtype.npy", _npy_bytes(good.astype(np.int64)), "dtype i64 ('<i8') does not match"),
        ("truncated.npy", npy[:header_len + 100], "truncated .npy: expected 3072 bytes of data, found 100"),
        ("truncated_header.npy", npy[:30], "truncated .npy header"),
        ("trailing.npy", npy + b"\0\0\0\0", "unexpected bytes after the .npy data"),
        ("big_endian.npy", big_endian, "big-endian .npy data ('>f4') is not supported"),
        ("fortran.npy", fortran, "Fortran-order .npy arrays are not supported"),
        ("bad_header.npy", npy[:10] + b"{'descr': '<f4', 'shape': __import__('os')}".ljust(npy[8] - 1) + b"\n",
         "malformed .npy header"),
        ("huge_dim.npy", npy[:10] + b"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }"
         .ljust(npy[8] - 1) + b"\n", "a dimension overflows 64 bits"),
        ("empty.bin", b"", "not a JPEG, PNG or .npy file"),
        ("text.txt", b"hello, world\n", "not a JPEG, PNG or .npy file"),
        ("corrupt.jpg", _good_jpeg()[:20] + bytes(range(256)) * 4, "corrupt JPEG: "),
        ("truncated.jpg", _good_jpeg()[: len(_good_jpeg()) // 2], "corrupt JPEG: Premature end of JPEG file"),
        ("truncated.png", _good_png()[: len(_good_png()) // 2], "corrupt PNG: "),
        ("png_header_only.png", _good_png()[:20], "corrupt PNG: "),
        ("bad_crc.png", _bad_png_crc(), "corrupt PNG: IDAT: CRC error"),
        ("huge.png", _huge_png(), "corrupt PNG: Invalid IHDR data (Image width exceeds user limit in IHDR)"),
        ("huge.jpg", _huge_jpeg(), "JPEG image of 60000x60000 pixels exceeds the limit"),
    ]


def check_bad_input(run_exe, prog: str, tmp_path, name, data, phrase) -> None:
    """The bad input `data` (bytes, "DIR", or None: missing) under `name`: `run_exe(src,
    out)` exits 1 with one line naming input x and `phrase`, for a new .json, a new .npy
    and an existing output, and leaves the output directory as it was."""
    src = tmp_path / "in" / name
    src.parent.mkdir()
    if data == "DIR":
        src.mkdir()
    elif data is not None:
        src.write_bytes(data)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "kept.json").write_text("previous result")
    for out in (out_dir / "new.json", out_dir / "new.npy", out_dir / "kept.json"):
        proc = run_exe(src, out)
        assert proc.returncode == 1, (proc.returncode, proc.stderr)
        line = _one_line(proc, prog)
        assert line.startswith(f"{prog}: input 'x' ({src}): ") and phrase in line, line
    assert sorted(p.name for p in out_dir.iterdir()) == ["kept.json"]
    assert (out_dir / "kept.json").read_text() == "previous result"


@pytest.mark.parametrize("name,data,phrase", _bad_inputs(), ids=[c[0] for c in _bad_inputs()])
def test_bad_input_exit_1_one_line_no_output(cnn, tmp_path, name, data, phrase):
    check_bad_input(lambda src, out: run_c(cnn.artifact("exe"), "--input", src, "--output", out), "tiny_cnn",
                    tmp_path, name, data, phrase)


def test_output_errors(cnn, tmp_path):
    np.save(tmp_path / "x.npy", cnn.random_inputs(0)[0])
    proc = run_c(cnn.artifact("exe"), "--input", tmp_path / "x.npy", "--output", tmp_path / "no" / "such" / "o.json")
    assert proc.returncode == 1 and "output: cannot create" in _one_line(proc, "tiny_cnn")
    (tmp_path / "d.json").mkdir()
    proc = run_c(cnn.artifact("exe"), "--input", tmp_path / "x.npy", "--output", tmp_path / "d.json")
    assert proc.returncode == 1 and "is a directory" in _one_line(proc, "tiny_cnn")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.json", "x.npy"]
