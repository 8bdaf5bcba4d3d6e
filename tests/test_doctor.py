"""python -m torchneuron.doctor: a script with a planted fallback and a planted recompile, reported."""
import base64
import html.parser
import io
import runpy
import sys
import textwrap
import pytest
import torch

from torchneuron.profiler import doctor
from torchneuron.profiler.collector import Collector
from torchneuron.runtime import events

PLANTED = textwrap.dedent("""\
    import sys
    import torch
    import torchneuron

    cumsum = torch.ops.aten.cumsum.default
    torchneuron.library.force_cpu(cumsum)
    try:
        model = torch.nn.Linear(11, 5).to("neuron")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(4):
            loss = model(torch.randn(13, 11, device="neuron")).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            running = loss.detach().reshape(1).cumsum(0)  # the planted fallback (line 15)
        scale = torch.compile(lambda t: t * 2 + 1, backend="neuron", dynamic=False)  # line 16
        for n in range(3, 3 + int(sys.argv[1])):
            scale(torch.ones(n, device="neuron"))  # the planted recompile: a new shape each call
    finally:
        torchneuron.library.force_cpu(cumsum, False)
""")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """The doctor's run of the planted script: exit status, printed report, HTML page. Its shapes are ones
    no other test uses, so its programs compile in this run (another test of the same process would
    otherwise have compiled them, and the slowest ops' ranks would be noise)."""
    directory = tmp_path_factory.mktemp("doctor")
    script = directory / "planted.py"
    script.write_text(PLANTED)
    page = directory / "report.html"
    out = io.StringIO()
    stdout, sys.stdout = sys.stdout, out
    try:
        status = doctor.main(["--strict", "--recompile-limit", "2", "--html", str(page), str(script), "4"])
    finally:
        sys.stdout = stdout
    return status, out.getvalue(), page.read_text(), str(script)


def _section(report: str, title: str) -> str:
    start = report.index(f"== {title}")
    end = report.find("\n== ", start + 1)
    return report[start:end if end >= 0 else None]


def test_report_names_the_planted_fallback_with_its_call_site(planted):
    _, report, _, script = planted
    fallbacks = _section(report, "CPU fallbacks")
    assert "aten.cumsum.default  4 " in fallbacks
    assert f"{script}:15 (<module>)" in fallbacks


def test_report_names_the_planted_recompile_and_its_cause(planted):
    _, report, _, script = planted
    recompiles = _section(report, "Recompilations")
    graph_row = next(line for line in recompiles.splitlines() if "neuron_graph_" in line)
    # 4 shapes: 3 recompiles, found in the compiled function (its frame is the innermost of the user's)
    assert "shape x3" in graph_row and f"{script}:16 (<lambda>)" in graph_row
    dynamo = _section(report, "Dynamo recompilations")
    assert dynamo.count("size mismatch at index 0") >= 3
    storm = next(line for line in report.splitlines() if line.startswith("RECOMPILE STORM: "))
    assert "neuron_graph_" in storm and "Dynamo: 3 recompilations" in storm


def test_strict_fails_on_fallbacks_and_recompile_storms(planted):
    status, report, _, _ = planted
    assert status == 1
    assert "doctor --strict: failing on CPU fallbacks and a recompile storm" in report


def test_report_shows_costs_steps_transfers_and_memory(planted):
    _, report, _, script = planted
    assert "4 optimizer steps" in report
    assert "aten.addmm.default" in _section(report, "Slowest ops")
    assert "aten.addmm.default" in _section(report, "Slowest programs")
    assert "neuron_graph_" in _section(report, "Compilations")
    transfers = _section(report, "Transfers")
    assert "d2h" in transfers and "h2d" in transfers  # the fallback's round trip
    memory = _section(report, "Memory: peak")
    assert "float32" in memory and script in memory


class _Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.images, self.cells, self.headings, self.title = [], {}, [], [], ""
        self._in = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        if tag == "img":
            self.images[attrs["alt"]] = attrs["src"]
        self._in = tag

    def handle_data(self, data):
        if self._in == "td":
            self.cells.append(data)
        elif self._in == "h2":
            self.headings.append(data)
        elif self._in == "title":
            self.title += data

    def handle_endtag(self, tag):
        self._in = None


def test_html_page_is_self_contained_with_plots_and_tables(planted):
    from matplotlib import image

    _, _, page, script = planted
    parsed = _Page()
    parsed.feed(page)
    assert parsed.title == f"torchneuron doctor: {script}"
    assert not [t for t in parsed.tags if t in ("script", "link")]  # nothing fetched
    assert set(parsed.images) == {"Step time", "Memory over time", "Top ops"}
    for src in parsed.images.values():
        assert src.startswith("data:image/png;base64,")
        pixels = image.imread(io.BytesIO(base64.b64decode(src.split(",", 1)[1])), format="png")
        assert pixels.shape[0] > 100 and pixels.std() > 0  # a drawn plot, not a blank image
    assert "aten.cumsum.default" in parsed.cells
    assert any(cell.startswith(f"{script}:15") for cell in parsed.cells)
    assert "Graph breaks (torch.compile)" in parsed.headings
    assert not events.listening


def test_recompile_causes_shape_dtype_and_strides():
    a = torch.ones(3, 5, device="neuron")
    with Collector() as collector:
        torch.ones(3, device="neuron").sigmoid()
        torch.ones(4, device="neuron").sigmoid()
        torch.ones(4, device="neuron", dtype=torch.float64).sigmoid()
        torch.ones(5, 3, device="neuron").sigmoid()
        a.t().sigmoid()
    causes = [cause for name, cause, _, _ in collector.recompiles if name == "aten.sigmoid.default"]
    assert causes[:4] == ["shape", "dtype", "shape", "strides or storage offset"]


def test_recompile_causes_of_a_compiled_graph():
    """A compiled graph's programs are specialised per input signature (with dynamic=True, one graph meets
    new shapes), and the doctor names what changed, as for eager ops."""
    double_sine = torch.compile(lambda x: x.sin() * 2, backend="neuron", dynamic=True)
    square = torch.ones(4, 4, device="neuron")
    with Collector() as collector:
        double_sine(torch.ones(3, 2, device="neuron"))
        double_sine(torch.ones(5, 2, device="neuron"))
        double_sine(torch.ones(5, 2, device="neuron", dtype=torch.float64))
        double_sine(square)
        double_sine(square.t())
    causes = [cause for name, cause, _, _ in collector.recompiles if name.startswith("neuron_graph")]
    assert causes == ["shape", "dtype", "shape", "strides or storage offset"]


def test_script_exit_status_is_the_doctors(tmp_path, capsys):
    script = tmp_path / "fails.py"
    script.write_text("import sys\nsys.exit(3)\n")
    assert doctor.main([str(script)]) == 3


def test_module_entry_point_strict_passes_a_clean_script(tmp_path, monkeypatch, capsys):
    """`python -m torchneuron.doctor --strict clean.py`, run in this process (runpy, as -m does)."""
    script = tmp_path / "clean.py"
    script.write_text("import torch\nprint((torch.ones(3, device='neuron') * 2).sum().item())\n")
    monkeypatch.setattr(sys, "argv", ["torchneuron.doctor", "--strict", str(script)])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module("torchneuron.doctor", run_name="__main__")
    out = capsys.readouterr().out
    assert exit_.value.code == 0, out
    assert "6.0" in out and "== CPU fallbacks" in out and "RECOMPILE STORM" not in out


def test_a_signature_seen_before_was_evicted(monkeypatch):
    from torchneuron.runtime.cache import eager_cache

    monkeypatch.setattr(eager_cache, "entries", {})
    monkeypatch.setattr(eager_cache, "capacity", 1)  # each new executable evicts the one before
    x = torch.ones(3, device="neuron")
    with Collector() as collector:
        x.sin()
        x.cos()
        x.sin()
    assert [(name, cause) for name, cause, _, _ in collector.recompiles] == [
        ("aten.sin.default", "evicted from the executable cache (TORCHNEURON_EAGER_CACHE_SIZE)")
    ]
