"""The doctor's report, read in a minute: a summary of a Collector as text, and as a self-contained page."""
import base64
import collections
import html
import io
import statistics

TOP = 10
# a training loop's first steps build its executables (new shapes, optimizer state): recompiles after them
# are the costly kind, counted against --recompile-limit
WARM_UP_STEPS = 2


def summarize(c, recompile_limit: int) -> dict:
    """The facts the text and HTML reports show, from a finished Collector."""
    recompiles = collections.defaultdict(collections.Counter)
    sites, after_warm_up = {}, collections.Counter()
    warm_up = WARM_UP_STEPS if len(c.step_ends) > WARM_UP_STEPS else 0
    for name, cause, site, steps_before in c.recompiles:
        recompiles[name][cause] += 1
        sites.setdefault(name, site)
        after_warm_up[name] += steps_before >= warm_up
    storms = sorted(name for name, n in after_warm_up.items() if n > recompile_limit)
    if len(c.dynamo_recompiles) > recompile_limit:
        storms.append(f"Dynamo: {len(c.dynamo_recompiles)} recompilations")
    steps = [b - a for a, b in zip(c.step_ends, c.step_ends[1:])]
    return {
        "elapsed_s": c.elapsed_ns / 1e9,
        "steps": steps,
        "fallbacks": [(op, site, n) for (op, site), n in c.fallbacks.most_common()],
        "recompiles": sorted(((name, sum(causes.values()), after_warm_up[name], dict(causes), sites[name])
                              for name, causes in recompiles.items()), key=lambda r: (-r[2], -r[1])),
        "warm_up_steps": warm_up,
        "storms": storms,
        "dynamo_recompiles": list(c.dynamo_recompiles),
        "graph_breaks": c.graph_breaks.most_common(),
        "ops": sorted(((name, n, ns) for name, (n, ns) in c.ops.items()), key=lambda r: -r[2]),
        "programs": sorted(((name, n, ns, most) for name, (n, ns, most) in c.programs.items()), key=lambda r: -r[2]),
        "compiles": sorted(((name, n, ns) for name, (n, ns) in c.compiles.items()), key=lambda r: -r[2]),
        "flushes": dict(c.flushes),
        "replays": dict(c.replays),
        "transfers": sorted((d, n, b, ns) for d, (n, b, ns) in c.transfers.items()),
        "peak": c.peak,
        "largest": c.largest_at_peak,
        "timeline": c.timeline,
    }


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms"


def sections(s: dict) -> list:
    """(title, column names, rows, note when there are no rows) in the order a reader needs them."""
    fallback_rows = [(op, n, site) for op, site, n in s["fallbacks"]]
    recompile_rows = [(name, n, late, ", ".join(f"{cause} x{k}" for cause, k in causes.items()), site)
                      for name, n, late, causes, site in s["recompiles"][:TOP]]
    late_column = f"after step {s['warm_up_steps']}" if s["warm_up_steps"] else "after warm-up (no steps: all)"
    dynamo_rows = [(reason.replace("\n", " ").strip(),) for reason in s["dynamo_recompiles"][:TOP]]
    largest = [(_bytes(nbytes), str(dtype).replace("torch.", ""), f"neuron:{device}", site)
               for nbytes, device, dtype, site in s["largest"]]
    transfers = [(d, n, _bytes(b), _ms(ns)) for d, n, b, ns in s["transfers"]]
    flushes = s["flushes"]
    flush_rows = [tuple(flushes.get(k, 0) for k in ("flushes", "op by op", "ops", "compiles"))] if flushes else []
    replays = s["replays"]
    replay_rows = [tuple(replays[k] for k in ("replays", "ops", "compiles"))] if replays else []
    return [
        ("CPU fallbacks (ops without a neuron lowering: each call copies its tensors to the host and back)",
         ("op", "calls", "first call site"), fallback_rows, "none"),
        ("Recompilations (a new executable for an op or graph already compiled: cause, call site)",
         ("op or graph", "recompiles", late_column, "causes", "first call site"), recompile_rows, "none"),
        ("Dynamo recompilations (guard failures)", ("reason",), dynamo_rows, "none"),
        ("Graph breaks (torch.compile)", ("reason", "count"), s["graph_breaks"][:TOP], "none"),
        ("Slowest ops (host time, each op's dispatch with what it caused)", ("op", "calls", "total", "mean"),
         [(name, n, _ms(ns), f"{ns / n / 1e3:.1f} us") for name, n, ns in s["ops"][:TOP]], "none"),
        ("Slowest programs (device time: the wait for each execution)", ("executable", "runs", "total", "longest"),
         [(name, n, _ms(ns), _ms(most)) for name, n, ns, most in s["programs"][:TOP]], "none"),
        ("Compilations (first runs: trace + XLA compile)", ("op or graph", "compiles", "total"),
         [(name, n, _ms(ns)) for name, n, ns in s["compiles"][:TOP]], "none"),
        ("Adaptive eager", ("queue runs", "of which op by op (new, or compiling)", "ops", "fused programs compiled"),
         flush_rows, "not used"),
        ("Captured graphs (torch.neuron.graph)", ("replays", "ops replayed", "programs compiled"), replay_rows,
         "none replayed"),
        ("Transfers", ("direction", "count", "bytes", "time"), transfers, "none"),
        (f"Memory: peak {_bytes(s['peak'])}; largest live tensors at the peak", ("bytes", "dtype", "device",
         "allocated at"), largest, "no neuron memory allocated"),
    ]


def text(s: dict, script: str) -> str:
    lines = [f"torchneuron doctor: {script}", f"ran {s['elapsed_s']:.2f} s" + _steps_line(s["steps"])]
    if s["storms"]:
        lines.append("RECOMPILE STORM: " + "; ".join(s["storms"]))
    for title, columns, rows, empty in sections(s):
        lines += ["", f"== {title}"]
        if not rows:
            lines.append(f"   {empty}")
            continue
        widths = [max(len(str(v)) for v in column) for column in zip(columns, *rows)]
        for row in (columns, *rows):
            lines.append("   " + "  ".join(str(v).ljust(w) for v, w in zip(row, widths)).rstrip())
    return "\n".join(lines) + "\n"


def _steps_line(steps) -> str:
    if not steps:
        return "; no optimizer steps"
    return f"; {len(steps) + 1} optimizer steps, median step {statistics.median(steps) * 1e3:.1f} ms"


def page(s: dict, script: str) -> str:
    """One HTML file with the report's tables and its plots (SVG, inline): nothing else to fetch."""
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>torchneuron doctor: {html.escape(script)}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}.storm{color:#b00;font-weight:bold}</style>",
        f"</head><body><h1>torchneuron doctor: {html.escape(script)}</h1>",
        f"<p>ran {s['elapsed_s']:.2f} s{html.escape(_steps_line(s['steps']))}</p>",
    ]
    if s["storms"]:
        parts.append(f"<p class='storm'>Recompile storm: {html.escape('; '.join(s['storms']))}</p>")
    parts += [_plot_section(title, fn, s) for title, fn in _PLOTS]
    for title, columns, rows, empty in sections(s):
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if not rows:
            parts.append(f"<p>{html.escape(empty)}</p>")
            continue
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row) + "</tr>" for row in rows)
        parts.append(f"<table><tr>{head}</tr>{body}</table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _plot_section(title, draw, s) -> str:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(8, 3))
    drawn = draw(axes, s)
    if not drawn:
        pyplot.close(figure)
        return f"<h2>{html.escape(title)}</h2><p>nothing to plot</p>"
    axes.set_title(title)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80)
    pyplot.close(figure)
    encoded = base64.b64encode(buffer.getvalue()).decode()
    return f"<h2>{html.escape(title)}</h2><img alt='{html.escape(title)}' src='data:image/png;base64,{encoded}'>"


def _step_times(axes, s) -> bool:
    if not s["steps"]:
        return False
    axes.plot(range(2, len(s["steps"]) + 2), [t * 1e3 for t in s["steps"]], marker="o")
    axes.set_xlabel("optimizer step")
    axes.set_ylabel("ms")
    return True


def _memory(axes, s) -> bool:
    if not s["timeline"]:
        return False
    times, allocated = zip(*s["timeline"])
    axes.step(times, [b / 2**20 for b in allocated], where="post")
    axes.set_xlabel("s")
    axes.set_ylabel("MiB allocated")
    return True


def _top_ops(axes, s) -> bool:
    ops = s["ops"][:TOP]
    if not ops:
        return False
    axes.barh([name for name, _, _ in ops][::-1], [ns / 1e6 for _, _, ns in ops][::-1])
    axes.set_xlabel("ms (host)")
    axes.tick_params(axis="y", labelsize=7)
    return True


_PLOTS = (("Step time", _step_times), ("Memory over time", _memory), ("Top ops", _top_ops))
