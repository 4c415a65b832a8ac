"""A host's file tree under a temp root (the root of Settings), and the files of an Ascend A2 node in it."""

from __future__ import annotations

from pathlib import Path

from tests.support.captures import capture

# The directories npuops reads on a host.
HOST_DIRS = ("dev", "proc/self", "proc/sys/kernel", "sys/devices/system/cpu", "sys/devices/system/node",
             "sys/bus/pci/devices", "etc", "usr/local/Ascend")


def make_host_tree(root: Path) -> Path:
    """An empty host tree at `root` with the directories npuops reads."""
    for d in HOST_DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)
    return root


def put(root: Path, path: str, text: str) -> Path:
    """Write `text` at the absolute host path `path` inside the tree `root`."""
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return target


def install_a2_node(root: Path, layout: str = "ascend-toolkit") -> None:
    """An 800I A2 node's Ascend files from real captures: driver, firmware, CANN (`layout` ascend-toolkit or cann),
    NNAL, and the device nodes of 8 chips."""
    put(root, "/usr/local/Ascend/driver/version.info", capture("driver-version-info_25.0.rc1.1_1.txt"))
    put(root, "/usr/local/Ascend/firmware/version.info", capture("firmware-version-info_doc_1.txt"))
    if layout == "ascend-toolkit":
        put(root, "/usr/local/Ascend/ascend-toolkit/latest/aarch64-linux/ascend_toolkit_install.info",
            capture("ascend_toolkit_install-info_aarch64_3.txt"))
        put(root, "/usr/local/Ascend/ascend-toolkit/latest/version.cfg",
            capture("ascend-toolkit-version-cfg_8.2.RC2_1.txt"))
        put(root, "/usr/local/Ascend/ascend-toolkit/set_env.sh", "# vendor script\n")
    else:
        put(root, "/usr/local/Ascend/cann/aarch64-linux/ascend_toolkit_install.info",
            capture("ascend_toolkit_install-info_doc_1.txt"))
        put(root, "/usr/local/Ascend/cann/set_env.sh", "# vendor script\n")
    put(root, "/usr/local/Ascend/nnal/atb/latest/version.info", capture("nnal-atb-version-info_8.2.RC2_1.txt"))
    put(root, "/usr/local/Ascend/nnal/atb/set_env.sh", "# vendor script\n")
    for n in range(8):
        put(root, f"/dev/davinci{n}", "")
    for name in ("davinci_manager", "devmm_svm", "hisi_hdc"):
        put(root, f"/dev/{name}", "")
