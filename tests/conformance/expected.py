"""The expected-failures list: `expected_failures.txt`, one `<op> <check>:<dtype>  <reason>` a line."""
from pathlib import Path

PATH = Path(__file__).with_name("expected_failures.txt")


def load(path=PATH) -> dict:
    entries = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        op, check, reason = (line.split(None, 2) + [""])[:3]
        if not reason.strip():
            raise ValueError(f"{path.name}:{number}: an expected failure needs a reason")
        entries[f"{op} {check}"] = reason.strip()
    return entries
