"""Label arithmetic for the macros (the targets cuvil_model makes beside its own)."""

def sibling_label(label, suffix):
    """`label` with `suffix` added to its target name, in the same package.

    ":m" -> ":m_x", "m" -> "m_x", "//p:m" -> "//p:m_x", "//p/m" -> "//p/m:m_x",
    "@r//p:m" -> "@r//p:m_x".
    """
    if type(label) == "Label":
        label = str(label)
    if "//" not in label:
        return label + suffix
    package_part = label.split("//", 1)[1]
    if ":" in package_part:
        return label + suffix
    return "%s:%s%s" % (label, package_part.split("/")[-1], suffix)
