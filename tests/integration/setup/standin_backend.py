"""The PEP 517 build backend of test_container_install.py's stand-in project (copied in as backend.py).

Offline and self-contained: no setuptools or wheel to fetch into the throwaway venv. The project's
requirements are read from its requires.txt; its editable install is a .pth file pointing at it."""

import base64
import hashlib
import pathlib
import zipfile

HERE = pathlib.Path(__file__).parent
INFO = "standin_rl-0.1.0.dist-info"


def _wheel(directory: str, files: dict[str, str]) -> str:
    requires = [r for r in (HERE / "requires.txt").read_text().splitlines() if r]
    files = {
        **files,
        f"{INFO}/METADATA": "Metadata-Version: 2.1\nName: standin-rl\nVersion: 0.1.0\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{INFO}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{INFO}/RECORD"] = "\n".join([*record, f"{INFO}/RECORD,,"]) + "\n"
    name = "standin_rl-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(pathlib.Path(directory) / name, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


get_requires_for_build_editable = get_requires_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {"standin_rl/__init__.py": ""})


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {"standin_rl.pth": f"{HERE}\n"})
