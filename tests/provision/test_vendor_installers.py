"""The vendor-style `.run` builder itself: real makeself archives, vendor flags, the files npuops reads."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from npuops.hardware.node import read_cann, read_driver
from npuops.hardware.probe import Probe
from npuops.hardware.versions import (
    parse_ascend_install_info,
    parse_ascend_version,
    parse_driver_version_info,
    parse_firmware_version_info,
    parse_nnal_version_info,
    parse_toolkit_install_info,
    parse_version_cfg,
)
from npuops.launch.ascend_env import capture_set_env
from npuops.settings import Settings
from tests.support.vendor_installers import (
    KINDS,
    Kind,
    build_installer,
    build_package_set,
    installer_file_name,
    makeself_available,
    run_installer,
    sha256_of,
    write_sha256sums,
)

pytestmark = pytest.mark.skipif(not makeself_available(), reason="makeself is not installed (apt-get install makeself)")

DRIVER, FIRMWARE, CANN, CANN_NEXT, CANN_NEW = "25.2.0", "7.7.0.6.236", "8.2.RC1", "8.3.RC1", "8.5.0"
ASCEND = "/usr/local/Ascend"


class Built:
    """Installers built once for the module, by (kind, version)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self._cache: dict[tuple[str, str, str | None], Path] = {}

    def __call__(self, kind: Kind, version: str, fail_env: str | None = None) -> Path:
        key = (kind, version, fail_env)
        if key not in self._cache:
            out = self.out / (fail_env or "default")
            self._cache[key] = build_installer(kind, version, out, fail_env=fail_env,
                                               hdk_version=DRIVER if kind == "firmware" else None)
        return self._cache[key]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return Built(tmp_path_factory.mktemp("runs"))


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    """A host tree whose /usr/local exists (the driver creates one directory level, like the real one)."""
    host = tmp_path / "root"
    (host / "usr/local").mkdir(parents=True)
    (host / "etc").mkdir()
    yield host


def _install(run: Path, root: Path, *flags: str, env: Mapping[str, str] | None = None,
             stdin: str = "") -> subprocess.CompletedProcess[str]:
    return run_installer(run, *flags, f"--install-path={root}{ASCEND}", env=env, stdin=stdin)


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _toolkit_env(root: Path) -> dict[str, str]:
    """The variables the toolkit's set_env.sh sets (what a shell that sourced it hands to the NNAL installer)."""
    env, error = capture_set_env(Probe(Settings(root=root)), [f"{ASCEND}/ascend-toolkit/set_env.sh"])
    assert error is None
    return env


def _probe(root: Path) -> Probe:
    return Probe(Settings(root=root), machine=lambda: "x86_64")


# --- names -------------------------------------------------------------------------------------------------------


def test_file_names_follow_the_vendor_patterns() -> None:
    assert installer_file_name("driver", DRIVER) == "Ascend-hdk-910b-npu-driver_25.2.0_linux-x86-64.run"
    arm = installer_file_name("driver", DRIVER, arch="aarch64")
    assert arm == "Ascend-hdk-910b-npu-driver_25.2.0_linux-aarch64.run"
    assert installer_file_name("firmware", FIRMWARE) == "Ascend-hdk-910b-npu-firmware_7.7.0.6.236.run"
    assert installer_file_name("toolkit", CANN) == "Ascend-cann-toolkit_8.2.RC1_linux-x86_64.run"
    assert installer_file_name("kernels", CANN) == "Ascend-cann-kernels-910b_8.2.RC1_linux-x86_64.run"
    assert installer_file_name("ops", CANN_NEW, arch="aarch64") == "Ascend-cann-910b-ops_8.5.0_linux-aarch64.run"
    assert installer_file_name("nnal", CANN) == "Ascend-cann-nnal_8.2.RC1_linux-x86_64.run"
    with pytest.raises(ValueError, match="ops"):
        installer_file_name("kernels", CANN_NEW)
    with pytest.raises(ValueError, match="kernels"):
        installer_file_name("ops", CANN)
    with pytest.raises(ValueError):
        installer_file_name("toolkit", "8.2.RC1; rm -rf /")


def test_a_package_set_is_consistent(tmp_path: Path) -> None:
    old = build_package_set(tmp_path / "old")
    assert sorted(old) == ["driver", "firmware", "kernels", "nnal", "toolkit"]
    assert old["firmware"].name == "Ascend-hdk-910b-npu-firmware_7.7.0.6.236.run"
    new = build_package_set(tmp_path / "new", cann=CANN_NEW, arch="aarch64")
    assert "ops" in new and "kernels" not in new
    assert new["ops"].name == "Ascend-cann-910b-ops_8.5.0_linux-aarch64.run"
    assert all(_ok(run_installer(path, "--version")).strip() in (DRIVER, FIRMWARE, CANN_NEW)
               for path in new.values())


# --- makeself ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_builds_checks_and_prints_its_version(built: Built, kind: Kind) -> None:
    version = {"driver": DRIVER, "firmware": FIRMWARE, "ops": CANN_NEW}.get(kind, CANN)
    run = built(kind, version)
    assert run.name == installer_file_name(kind, version)
    check = run_installer(run, "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "All good" in check.stdout
    assert _ok(run_installer(run, "--version")).strip() == version
    assert _ok(run_installer(run, "--quiet", "--version")).strip() == version


def test_a_corrupted_copy_fails_the_integrity_check(built: Built, tmp_path: Path) -> None:
    data = bytearray(built("toolkit", CANN).read_bytes())
    data[-64] ^= 0xFF  # inside the compressed payload, at the end of the file
    bad = tmp_path / "Ascend-cann-toolkit_8.2.RC1_linux-x86_64.run"
    bad.write_bytes(bytes(data))
    bad.chmod(0o755)
    check = run_installer(bad, "--check")
    assert check.returncode != 0
    assert "checksum" in check.stderr.lower()
    install = run_installer(bad, "--install", "--quiet", f"--install-path={tmp_path / 'Ascend'}")
    assert install.returncode != 0 and not (tmp_path / "Ascend").exists()


def test_extract_unpacks_without_installing(built: Built, tmp_path: Path) -> None:
    _ok(run_installer(built("driver", DRIVER), f"--extract={tmp_path / 'x'}"))
    assert (tmp_path / "x/install.sh").is_file()
    assert (tmp_path / "x/payload/info/driver/version.info").is_file()


# --- what an install leaves, read by npuops ------------------------------------------------------------------------


def test_driver_and_firmware_as_npuops_reads_them(built: Built, root: Path) -> None:
    record = root / "etc/ascend_install.info"
    env = {"ASCEND_INSTALL_INFO": str(record)}
    out = _ok(_install(built("driver", DRIVER), root, "--full", "--install-for-all", "--quiet", env=env))
    assert "Reboot needed" in out
    _ok(_install(built("firmware", FIRMWARE), root, "--full", "--quiet", env=env))
    ascend = root / ASCEND.lstrip("/")
    assert (ascend / "driver/lib64/driver/libascend_hal.so").is_file()
    driver_info = parse_driver_version_info((ascend / "driver/version.info").read_text())
    assert parse_ascend_version(driver_info.version) == parse_ascend_version(DRIVER)
    firmware_info = parse_firmware_version_info((ascend / "firmware/version.info").read_text())
    assert firmware_info.version == FIRMWARE and firmware_info.package_version == DRIVER
    assert driver_info.compatible_firmware is not None
    low, high = (parse_ascend_version(v) for v in driver_info.compatible_firmware)
    assert low <= parse_ascend_version(FIRMWARE) <= high
    install_info = parse_ascend_install_info(record.read_text())
    assert install_info.driver_install_path == str(ascend)
    assert install_info.firmware_install_path == str(ascend)
    assert ("Driver_Install_For_All", "yes") in install_info.raw
    # npuops over the tree: no /etc/ascend_install.info under this root, so it reads Settings.ascend_root.
    record.unlink()
    driver, firmware, _ = read_driver(_probe(root))
    assert (driver.installed, driver.version, driver.details["package_version"]) == (True, DRIVER, DRIVER)
    assert (firmware.installed, firmware.version) == (True, FIRMWARE)


def test_cann_83_layout_as_npuops_reads_it(built: Built, root: Path) -> None:
    _ok(_install(built("toolkit", CANN), root, "--install", "--install-for-all", "--quiet"))
    _ok(_install(built("kernels", CANN), root, "--install", "--quiet"))
    _ok(_install(built("nnal", CANN), root, "--install", "--quiet", env=_toolkit_env(root)))
    toolkit = root / ASCEND.lstrip("/") / "ascend-toolkit"
    assert (toolkit / "latest").is_symlink() and (toolkit / "latest").readlink() == Path(CANN)
    info = parse_toolkit_install_info((toolkit / "latest/x86_64-linux/ascend_toolkit_install.info").read_text())
    assert info.path == f"{root}{ASCEND}/ascend-toolkit/{CANN}/x86_64-linux" and info.arch == "x86_64"
    assert parse_version_cfg((toolkit / "latest/version.cfg").read_text()).installed["opp_kernel"] == CANN
    cann = read_cann(_probe(root))
    assert cann.layout == "ascend-toolkit"
    assert (cann.toolkit.version, cann.kernels.version, cann.nnal.version) == (CANN, CANN, CANN)
    assert parse_ascend_version(cann.toolkit.version or "") == parse_ascend_version(CANN)
    assert set(cann.set_env_scripts) == {f"{ASCEND}/ascend-toolkit/set_env.sh", f"{ASCEND}/nnal/atb/set_env.sh"}


def test_cann_85_layout_with_ops_as_npuops_reads_it(built: Built, root: Path) -> None:
    _ok(_install(built("toolkit", CANN_NEW), root, "--install", "--quiet"))
    _ok(_install(built("ops", CANN_NEW), root, "--install", "--quiet"))
    ascend = root / ASCEND.lstrip("/")
    assert (ascend / "cann").readlink() == Path(f"cann-{CANN_NEW}")
    assert not (ascend / "ascend-toolkit").exists()
    ops = parse_toolkit_install_info((ascend / "cann/x86_64-linux/ascend_ops_install.info").read_text())
    assert (ops.package_name, ops.version) == ("Ascend-cann-910b-ops", CANN_NEW)
    cann = read_cann(_probe(root))
    assert (cann.layout, cann.toolkit.version, cann.kernels.version) == ("cann", CANN_NEW, CANN_NEW)
    assert cann.set_env_scripts == (f"{ASCEND}/cann/set_env.sh",)
    env, error = capture_set_env(_probe(root), [f"{ASCEND}/cann/set_env.sh"])
    assert error is None and env["ASCEND_HOME_PATH"] == f"{ascend}/cann-{CANN_NEW}"


def test_set_env_scripts_point_inside_the_install_path(built: Built, root: Path) -> None:
    _ok(_install(built("toolkit", CANN), root, "--install", "--quiet"))
    _ok(_install(built("nnal", CANN), root, "--install", "--quiet", env=_toolkit_env(root)))
    ascend = f"{root}{ASCEND}"
    env, error = capture_set_env(_probe(root), [f"{ASCEND}/ascend-toolkit/set_env.sh", f"{ASCEND}/nnal/atb/set_env.sh"])
    assert error is None
    home = f"{ascend}/ascend-toolkit/latest"
    assert env["ASCEND_TOOLKIT_HOME"] == env["ASCEND_HOME_PATH"] == env["ASCEND_AICPU_PATH"] == home
    assert env["ASCEND_OPP_PATH"] == f"{home}/opp"
    libs = env["LD_LIBRARY_PATH"].split(":")
    atb_libs = f"{ascend}/nnal/atb/latest/atb/cxx_abi_1/lib"
    assert {f"{home}/lib64", f"{ascend}/driver/lib64/driver", atb_libs} <= set(libs)
    assert libs[0].startswith(f"{ascend}/nnal/")  # NNAL sourced last: its libraries come first
    assert env["ATB_HOME_PATH"] == f"{ascend}/nnal/atb/latest/atb/cxx_abi_1"
    assert env["PYTHONPATH"].split(":")[0] == f"{home}/python/site-packages"
    assert f"{home}/bin" in env["PATH"].split(":")
    assert Path(home, "lib64/libascendcl.so").is_file()  # the placeholder, reached through latest/lib64


# --- refusals and failures -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "flag"), [("driver", "--install"), ("toolkit", "--bogus"), ("nnal", "--full"),
                                            ("firmware", "--install-for-everyone")])
def test_an_unknown_flag_is_refused_and_named(built: Built, root: Path, kind: Kind, flag: str) -> None:
    version = {"driver": DRIVER, "firmware": FIRMWARE}.get(kind, CANN)
    result = _install(built(kind, version), root, flag, "--quiet")
    assert result.returncode != 0
    assert f"Unrecognized parameters: {flag}." in result.stdout
    assert not (root / ASCEND.lstrip("/")).exists()


def test_without_an_install_path_the_real_one_is_refused(built: Built) -> None:
    result = run_installer(built("toolkit", CANN), "--install", "--quiet")
    assert result.returncode != 0 and "refuses to write" in result.stdout
    result = run_installer(built("driver", DRIVER), "--full", "--quiet")
    assert result.returncode != 0 and "/usr/local/Ascend" in result.stdout


def test_on_demand_failure_leaves_a_partial_install_and_a_retry_completes(built: Built, root: Path) -> None:
    run = built("toolkit", CANN)
    failed = _install(run, root, "--install", "--quiet", env={"NPUOPS_TEST_FAIL_TOOLKIT": "1"})
    assert failed.returncode != 0
    assert "[ERROR] Ascend-cann-toolkit install failed (NPUOPS_TEST_FAIL_TOOLKIT is set)" in failed.stdout
    version_dir = root / ASCEND.lstrip("/") / "ascend-toolkit" / CANN
    assert (version_dir / "x86_64-linux/lib64/libascendcl.so").is_file()  # partial: files, but no version info
    assert not (version_dir / "x86_64-linux/ascend_toolkit_install.info").exists()
    assert read_cann(_probe(root)).toolkit.installed is False
    _ok(_install(run, root, "--install", "--quiet", env={"NPUOPS_TEST_FAIL_TOOLKIT": "0"}))
    assert read_cann(_probe(root)).toolkit.version == CANN


def test_a_custom_failure_variable(built: Built, root: Path) -> None:
    run = built("driver", DRIVER, fail_env="MY_DRIVER_BREAKS")
    assert _install(run, root, "--full", "--quiet", env={"NPUOPS_TEST_FAIL_DRIVER": "1"}).returncode == 0
    failed = _install(run, root, "--full", "--quiet", env={"MY_DRIVER_BREAKS": "yes"})
    assert failed.returncode != 0 and "[ERROR]Driver install failed (MY_DRIVER_BREAKS is set)" in failed.stdout
    assert not (root / ASCEND.lstrip("/") / "driver/version.info").exists()


def test_kernels_and_ops_need_the_same_version_toolkit(built: Built, root: Path) -> None:
    refused = _install(built("kernels", CANN), root, "--install", "--quiet")
    assert refused.returncode != 0 and "needs Ascend-cann-toolkit 8.2.RC1 installed first" in refused.stdout
    _ok(_install(built("toolkit", CANN_NEXT), root, "--install", "--quiet"))
    assert _install(built("kernels", CANN), root, "--install", "--quiet").returncode != 0
    assert _install(built("ops", CANN_NEW), root, "--install", "--quiet").returncode != 0
    assert read_cann(_probe(root)).kernels.installed is False


def test_nnal_needs_the_toolkit_environment(built: Built, root: Path) -> None:
    run = built("nnal", CANN)
    refused = _install(run, root, "--install", "--quiet")
    assert refused.returncode != 0
    assert "please check env ASCEND_TOOLKIT_HOME or ASCEND_NNAE_HOME is set" in refused.stdout
    gone = {"ASCEND_TOOLKIT_HOME": str(root / "nowhere"), "ASCEND_HOME_PATH": str(root / "nowhere")}
    refused = _install(run, root, "--install", "--quiet", env=gone)
    assert refused.returncode != 0 and "can not find cann in" in refused.stdout
    assert not (root / ASCEND.lstrip("/") / "nnal").exists()


# --- versions over time --------------------------------------------------------------------------------------------


def test_a_second_toolkit_keeps_both_and_latest_follows_the_last_install(built: Built, root: Path) -> None:
    _ok(_install(built("toolkit", CANN), root, "--install", "--quiet"))
    _ok(_install(built("toolkit", CANN_NEXT), root, "--install", "--quiet"))
    toolkit = root / ASCEND.lstrip("/") / "ascend-toolkit"
    assert (toolkit / CANN).is_dir() and (toolkit / CANN_NEXT).is_dir()
    assert read_cann(_probe(root)).toolkit.version == CANN_NEXT
    _ok(_install(built("toolkit", CANN_NEXT), root, "--uninstall", "--quiet"))
    assert (toolkit / "latest").readlink() == Path(CANN)
    _ok(_install(built("toolkit", CANN), root, "--uninstall", "--quiet"))
    assert not toolkit.exists()


def test_upgrade_replaces_the_version(built: Built, root: Path) -> None:
    assert _install(built("toolkit", CANN_NEXT), root, "--upgrade", "--quiet").returncode != 0  # nothing to upgrade
    _ok(_install(built("toolkit", CANN), root, "--install", "--quiet"))
    _ok(_install(built("toolkit", CANN_NEXT), root, "--upgrade", "--quiet"))
    toolkit = root / ASCEND.lstrip("/") / "ascend-toolkit"
    assert sorted(p.name for p in toolkit.iterdir()) == [CANN_NEXT, "latest", "set_env.sh"]
    assert read_cann(_probe(root)).toolkit.version == CANN_NEXT


def test_driver_upgrade_takes_its_path_from_the_install_record(built: Built, root: Path) -> None:
    env = {"ASCEND_INSTALL_INFO": str(root / "etc/ascend_install.info")}
    _ok(_install(built("driver", "25.0.rc1.1"), root, "--full", "--quiet", env=env))
    refused = _install(built("driver", DRIVER), root, "--upgrade", "--quiet", env=env)
    assert refused.returncode != 0 and "install-path param need used with full/run/docker/devel" in refused.stdout
    out = _ok(run_installer(built("driver", DRIVER), "--upgrade", "--quiet", env=env))
    assert "Driver package upgraded successfully!" in out
    # (npuops would look for the recorded host path under Settings.root, so the file is read directly here.)
    text = (root / ASCEND.lstrip("/") / "driver/version.info").read_text()
    assert parse_driver_version_info(text).version == DRIVER
    _ok(run_installer(built("driver", DRIVER), "--uninstall", env=env))
    assert not (root / "etc/ascend_install.info").exists()  # no *Install_Path_Param left: the record goes


def test_without_quiet_the_driver_asks_about_the_missing_chip(built: Built, root: Path) -> None:
    run = built("driver", DRIVER)
    asked = _install(run, root, "--full")
    assert asked.returncode != 0 and "There is no chip matching the driver package." in asked.stdout
    assert "[INFO]Stop installation!" in _ok(_install(run, root, "--full", stdin="n\n"))
    _ok(_install(run, root, "--full", stdin="y\n"))
    _ok(_install(run, root, "--quiet", "--full"))  # makeself takes --quiet first and still hands it on


def test_without_quiet_cann_packages_ask_for_the_eula(built: Built, root: Path) -> None:
    run = built("toolkit", CANN)
    asked = _install(run, root, "--install")
    assert asked.returncode != 0 and "EULA" in asked.stdout and "pass --quiet" in asked.stdout
    _ok(_install(run, root, "--install", stdin="y\n"))


def test_logs_only_where_asked(built: Built, root: Path, tmp_path: Path) -> None:
    logs = tmp_path / "var/log/ascend_seclog"
    _ok(_install(built("toolkit", CANN), root, "--install", "--quiet", env={"NPUOPS_TEST_ASCEND_LOG_DIR": str(logs)}))
    text = (logs / "ascend_toolkit_install.log").read_text()
    assert "UserCommand: Ascend-cann-toolkit_8.2.RC1_linux-x86_64.run --install --quiet" in text
    assert "install success" in text
    _ok(_install(built("driver", DRIVER), root, "--full", "--quiet"))
    assert sorted(p.name for p in logs.iterdir()) == ["ascend_toolkit_install.log"]


# --- SHA256SUMS ----------------------------------------------------------------------------------------------------


def test_sha256sums_match_sha256sum(built: Built, tmp_path: Path) -> None:
    packages = build_package_set(tmp_path / "pkgs")
    manifest = write_sha256sums(tmp_path / "pkgs")
    lines = manifest.read_text().splitlines()
    assert [line.split("  ", 1)[1] for line in lines] == sorted(p.name for p in packages.values())
    assert f"{sha256_of(packages['driver'])}  {packages['driver'].name}" in lines
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path / "pkgs", capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def test_nnal_version_info_keeps_the_capture_format(built: Built, root: Path) -> None:
    _ok(_install(built("toolkit", CANN), root, "--install", "--quiet"))
    _ok(_install(built("nnal", CANN), root, "--install", "--quiet", env=_toolkit_env(root)))
    text = (root / ASCEND.lstrip("/") / "nnal/atb/latest/version.info").read_text()
    assert text.splitlines()[0] == f"    Ascend-cann-atb : {CANN}"
    info = parse_nnal_version_info(text)
    assert (info.version, info.build_version, info.platform) == (CANN, f"{CANN}.B030", "x86_64")
