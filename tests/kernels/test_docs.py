"""docs/kernels.md: its python blocks run as they stand, in order, in one process."""
import pathlib
import re

DOC = pathlib.Path(__file__).parents[2] / "docs" / "kernels.md"


def test_tutorial_blocks_run_in_order():
    text = DOC.read_text()
    blocks = list(re.finditer(r"```python\n(.*?)```", text, re.S))
    assert len(blocks) >= 6
    namespace = {"__name__": "docs_kernels"}
    for block in blocks:
        # padded so that errors (and KernelError's line) point at the document's own lines
        source = "\n" * text.count("\n", 0, block.start(1)) + block.group(1)
        exec(compile(source, str(DOC), "exec"), namespace)
