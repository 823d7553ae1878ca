"""Which Python a folder of torch/torch_xla wheels needs, from their `cpXY` tags.

pytorch/xla builds its PR wheels in its `development:3.12_tpuvm` image, so they are cp312; a job
that sets up another Python cannot install them, and pip says so only after minutes of
downloading. The reusable workflow asks this module which Python to set up, and the CI script
checks the interpreter it was given before installing anything.

    python -m harness.wheeltags DIR            prints `version=3.12` (a GitHub step output line)
    python -m harness.wheeltags DIR --check    exit 2 naming both versions unless this Python fits

It runs on the bare runner before any venv exists, where the system Python may lack
`packaging`; pip (which the runner's Python has) vendors the same module, so that one is used then.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

try:
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename
except ImportError:  # the bare runner's system Python: the copy pip vendors
    from pip._vendor.packaging.utils import InvalidWheelFilename, parse_wheel_filename  # type: ignore[no-redef]  # pip's copy of the same API

from harness.errors import HarnessUsageError
from harness.records.escaping import inert

_CPYTHON = re.compile(r"^cp(\d)(\d+)$")


def python_of_wheels(folder: Path) -> str:
    """'3.12' for a folder whose CPython wheels are cp312; HarnessUsageError if none or mixed."""
    versions = {}
    for wheel in sorted(Path(folder).glob("*.whl")):
        try:
            # A compressed tag set (cp312.cp313-...) comes back as one Tag per combination.
            tags = parse_wheel_filename(wheel.name)[3]
        except InvalidWheelFilename as exc:
            raise HarnessUsageError(
                f"{wheel.name} is not a wheel filename (name-version-python-abi-platform.whl): {exc}"
            ) from None
        found = {f"{m[1]}.{m[2]}" for m in (_CPYTHON.match(tag.interpreter) for tag in tags) if m}
        if found:
            versions[wheel.name] = found
    if not versions:
        raise HarnessUsageError(
            f"{folder}: no CPython-specific wheel (cpXY) there; give the folder with the torch_xla wheel"
        )
    common = set.intersection(*versions.values())
    if not common:
        listing = ", ".join(f"{name} ({'/'.join(sorted(v))})" for name, v in versions.items())
        raise HarnessUsageError(f"{folder}: the wheels were built for different Pythons: {listing}")
    return max(common, key=lambda v: tuple(int(p) for p in v.split(".")))


def check_interpreter(folder: Path, version: tuple[int, int] = sys.version_info[:2]) -> None:
    needed = python_of_wheels(folder)
    have = f"{version[0]}.{version[1]}"
    if needed != have:
        raise HarnessUsageError(
            f"the wheels in {folder} are for Python {needed} (cp{needed.replace('.', '')}), but this job's Python "
            f"is {have}: on the runner (container: ''), leave the workflow input python-version empty to follow "
            f"the wheels or set it to '{needed}'; in a container, use an image with Python {needed}"
        )


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    folders = [a for a in args if a != "--check"]
    if len(folders) != 1:
        print("usage: python -m harness.wheeltags DIR [--check]", file=sys.stderr)
        return 2
    try:
        if check:
            check_interpreter(Path(folders[0]))
        else:
            print(f"version={python_of_wheels(Path(folders[0]))}")
    except HarnessUsageError as exc:
        print(inert(f"harness.wheeltags: {exc}"), file=sys.stderr)  # a wheel's name is the PR's text
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
