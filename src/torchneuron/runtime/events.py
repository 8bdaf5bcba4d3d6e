"""What the backend does, told to whoever listens: the profiler and the doctor (torchneuron.profiler).

Lower layers report here and never import their listeners. Every call site is one line guarded by
the module global `listening`, so when nothing listens a site costs one attribute load and a branch
(bench/profiler_overhead.py measures it). A listener has three methods:

    begin(kind, name, details) -> token    a span starts (details: a dict of plain values)
    end(token, details)                    it ends
    instant(kind, name, details)           something happened (a fallback, an allocation)

and may set `wants_device_time`: executables are then waited for, in a nested "execute" span.

Kinds: "op" (one ATen call on neuron tensors, name the OpOverload), "compile" (an executable's first
run: trace and XLA compile), "launch" (a cached executable's run), "execute" (waiting for the device
to finish it: only where a listener sets `wants_device_time`), "graph_compile", "transfer",
"fallback", "flush" (adaptive eager's run of its queue: fused, or op by op for a new structure or one whose
fused program compiles), "graph_replay" (a captured graph's replay, torch.neuron.graph), "signature" (a new
executable for an op or graph, details["key"] its signature), "alloc" and "free" (name: the Storage).
"""
import jax

listening = False
_listeners = []
_device_time = False
# torchneuron.profiler's handler of torch.profiler sessions, told by patches.py (PyTorch tells a Python
# backend nothing): start(activities, config), stop(), stopped(results), exported(results, path)
session_handler = None


def executable_name(func) -> str:
    """`aten.add.Tensor` as `add_Tensor`: what an op's executable is called, by XLA and in JAX's traces."""
    return func.name().split("::")[-1].replace(".", "_")


def listen(listener) -> None:
    _listeners.append(listener)
    _update()


def stop_listening(listener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)
    _update()


def _update() -> None:
    global listening, _device_time
    listening = bool(_listeners)
    _device_time = any(getattr(listener, "wants_device_time", False) for listener in _listeners)


def span(kind, name, fn, args, details):
    """fn(*args) inside a span of every listener."""
    listeners = tuple(_listeners)
    tokens = [listener.begin(kind, name, details) for listener in listeners]
    try:
        return fn(*args)
    finally:
        for listener, token in zip(listeners, tokens):
            listener.end(token, details)


def instant(kind, name, details) -> None:
    for listener in tuple(_listeners):
        listener.instant(kind, name, details)


def op(func, handler, args, kwargs):
    """One ATen call dispatched to `handler`: its host time, with everything it caused nested inside."""
    return span("op", func, handler, (func, args, kwargs), {})


def launch(executable, flat):
    """An executable (its `compiled`, `op` name, `ran` once run, `device_index`) run on `flat`: its first
    run compiles (a cache miss), or loads what the disk cache held (`loaded_from_disk`); later ones are
    cache hits. Device time, when asked for, is the wait for its results, in a nested "execute" span."""
    first_run, name, device_index = not executable.ran, executable.op, executable.device_index
    kind = "compile" if first_run else "launch"
    cache = ("disk hit" if getattr(executable, "loaded_from_disk", False) else "miss") if first_run else "hit"
    details = {"cache": cache, "device": device_index}
    return span(kind, name, _run_and_wait, (executable.compiled, flat, name, device_index), details)


def _run_and_wait(compiled, flat, name, device_index):
    results = compiled(*flat)
    if _device_time:
        span("execute", name, jax.block_until_ready, (results,), {"device": device_index})
    return results


def transfer(direction: str, nbytes: int, device_index: int, fn, *args):
    """fn(*args) moving `nbytes` in `direction` ("h2d", "d2h", "d2d")."""
    return span("transfer", direction, fn, args, {"bytes": int(nbytes), "device": device_index})


def fallback(func) -> None:
    instant("fallback", func, {})


def signature(what: str, name, key) -> None:
    """A new executable for op or graph `name` (`what`: "eager" or "graph") and its signature `key`."""
    instant("signature", name, {"what": what, "key": key})


def flush(run, externals, n_ops: int, device_index: int, compiles: bool):
    """Adaptive eager runs its queue of `n_ops` ops as one fused program, `run(*externals)` (which compiles
    it first if `compiles`); its device time, when asked for, in a nested "execute" span."""
    return _fused_run("flush", fused_name(n_ops), run, externals, n_ops, device_index, compiles)


def graph_replay(run, externals, n_ops: int, device_index: int, compiles: bool):
    """A captured graph's replay: its program of `n_ops` ops, `run(*externals)`, as `flush` runs a queue's."""
    return _fused_run("graph_replay", graph_name(n_ops), run, externals, n_ops, device_index, compiles)


def _fused_run(kind, name, run, externals, n_ops, device_index, compiles):
    details = {"ops": n_ops, "inputs": len(externals), "cache": "miss" if compiles else "hit",
               "device": device_index}
    return span(kind, name, _run_and_wait, (run, externals, name, device_index), details)


def fused_name(n_ops: int) -> str:
    """The name of adaptive eager's fused program of `n_ops` ops, in XLA's program text and in profiles."""
    return f"adaptive_eager_{n_ops}_ops"


def graph_name(n_ops: int) -> str:
    """The name of a captured graph's program of `n_ops` ops, in XLA's program text and in profiles."""
    return f"captured_graph_{n_ops}_ops"


def flush_op_by_op(evaluate, args, n_ops: int, n_inputs: int, device_index: int):
    """Adaptive eager runs a queue whose structure is new op by op, `evaluate(*args)`: each op's launch
    nests inside."""
    details = {"ops": n_ops, "inputs": n_inputs, "cache": "op by op", "device": device_index}
    return span("flush", "adaptive_eager_op_by_op", evaluate, args, details)


def graph_compile(fn, args, name, cache_hit: bool):
    """A torch.compile graph's XLA executable: compiled, or loaded from the disk cache."""
    return span("graph_compile", name, fn, args, {"cache": "disk hit" if cache_hit else "miss"})


def alloc(storage) -> None:
    instant("alloc", storage, {})


def free(storage) -> None:
    instant("free", storage, {})
