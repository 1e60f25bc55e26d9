"""The sandboxed GPU runner: the only place a candidate kernel (and a problem file) executes.

    python -m klineage.gate.runner REQUEST.json RESULT.json

The parent (`klineage.gate.execute`) starts it in a fresh process group and reads RESULT.json,
never stdout. Progress goes to a JSON-lines file; a line {"waiting": true} precedes every
synchronisation so the parent can tell a hung kernel from a slow harness.
torch and pycuda are imported here only, never at engine import time.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from klineage.gate.params import (
    TensorMapError,
    as_pycuda_words,
    check_tensor_map_buffer,
    encode_tensor_map,
    pack_parameters,
    parameter_layout,
    read_kernel_parameters,
)
from klineage.gate.verdict import Reason
from klineage.launch import ResolvedLaunch
from klineage.problem import VendorTiming

HOST_COVER_CYCLES = 200_000  # about 100 us at H200 clocks: longer than any host dispatch we time
IDLE_COVER = 4  # the cover, in HOST_COVER_CYCLES, where the GPU has nothing queued ahead of a timed call
HOST_BOUND_US = 50.0  # half the cover: an eager dispatch longer than this leaks host time into its events
WARM_CLOCKS_S = 1.0  # busy work before an unsettled timing is measured again
PACKED_CACHE = 64  # parameter buffers kept per kernel (tensor maps are encoded once per buffer address)


class Progress:
    def __init__(self, path: str | None):
        self.path = Path(path) if path else None

    def emit(self, **event: Any) -> None:
        if self.path is None:
            return
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(event) + "\n")


class KernelFault(Exception):
    """A CUDA error raised by a candidate's launch or by the synchronisation after it."""

    def __init__(self, reason: Reason, message: str):
        self.reason = reason
        super().__init__(message)


def _finding(reason: Reason, stage: str, message: str, case: str = "", **evidence: Any) -> dict[str, Any]:
    return {"reason": reason.value, "stage": stage, "message": message, "case": case, "evidence": evidence}


class Device:
    """torch's primary context shared with pycuda, plus the facts a plan may use."""

    def __init__(self, progress: Progress):
        import pycuda.driver as drv
        import torch

        self.torch, self.drv, self.progress = torch, drv, progress
        torch.cuda.init()
        torch.zeros(1, device="cuda")  # create the primary context through torch
        drv.init()
        self.device = drv.Device(torch.cuda.current_device())
        self.context = self.device.retain_primary_context()
        self.context.push()
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        attr = drv.device_attribute
        self.name = props.name
        self.facts = {
            "num_sms": props.multi_processor_count,
            "smem_per_block_optin": self.device.get_attribute(attr.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            "max_threads_per_block": self.device.get_attribute(attr.MAX_THREADS_PER_BLOCK),
            "l2_bytes": props.L2_cache_size,
        }

    def environment(self) -> dict[str, Any]:
        torch, drv = self.torch, self.drv
        env = {
            "gpu": self.name,
            "compute_capability": ".".join(map(str, self.device.compute_capability())),
            "driver": _driver_version(),
            "cuda_driver_api": drv.get_driver_version(),
            "cuda_runtime": torch.version.cuda,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            **self.facts,
        }
        env["pci_bus_id"] = self.device.pci_bus_id()
        env.update(_clocks(env["pci_bus_id"]))
        return env

    def close(self) -> None:
        """Pop the shared context, or pycuda aborts the process at exit (and a sanitizer sees a crash)."""
        try:
            self.context.pop()
        except self.drv.Error:  # a context killed by the kernel cannot be popped; exiting cleans it up
            pass

    def synchronize(self, what: str) -> None:
        self.progress.emit(waiting=True, what=what, t=time.time())
        try:
            self.context.synchronize()
        except self.drv.Error as exc:
            raise KernelFault(_classify_cuda_error(str(exc)), f"{what}: {exc}") from None
        finally:
            self.progress.emit(waiting=False, what=what, t=time.time())


def _classify_cuda_error(text: str) -> Reason:
    """The driver's words as a reason. A resource limit is what the GPU cannot grant; a wrong address space
    ("operation not supported on global/shared address space": a global load of a local or shared address)
    is the kernel's fault, though its words name shared memory."""
    lowered = text.lower()
    if "address space" in lowered:
        return Reason.CRASH
    if "too many resources" in lowered or "out of resources" in lowered or "shared data" in lowered:
        return Reason.RESOURCE_LIMIT
    if "launch" in lowered and ("invalid" in lowered or "failed" in lowered) and "illegal" not in lowered:
        return Reason.LAUNCH_ERROR
    return Reason.CRASH


def _driver_version() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlSystemGetDriverVersion()
    except Exception:
        return "unknown"


def _clocks(pci_bus_id: str) -> dict[str, Any]:
    """Clocks of the GPU this process uses: NVML numbers GPUs ignoring CUDA_VISIBLE_DEVICES, so it
    is found by its PCI bus id."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
        return {"sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
                "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)}
    except Exception:
        return {}


class LoadedKernel:
    """A cubin loaded into the context, with its plan ready to run on named buffers."""

    def __init__(self, device: Device, spec: dict[str, Any]):
        self.device = device
        self.role = spec["role"]
        self.cubin = Path(spec["cubin"]).read_bytes()
        self.entries = dict(spec["entries"])
        # Where each parameter sits in the launch's parameter buffer, as the cubin declares it.
        self.parameters = {entry: read_kernel_parameters(self.cubin, symbol) for entry, symbol in self.entries.items()}
        self.static_shared = spec.get("static_shared", {})
        self.scratch_by_case = spec.get("scratch", {})
        self.launches_by_case = {case: [ResolvedLaunch.from_dict(x) for x in launches]
                                 for case, launches in spec["launches"].items()}
        self._packed: dict[tuple, list[Any]] = {}
        self.load()

    def load(self) -> None:
        """Load the module into the context, after what is loaded already: where a module loads
        moves the biggest kernels' times (docs/perf-notes.md, session 14)."""
        self.module = self.device.drv.module_from_buffer(self.cubin)
        self.functions = {entry: self.module.get_function(symbol) for entry, symbol in self.entries.items()}
        self._raised: dict[str, int] = {}  # entry -> the dynamic shared memory limit set on it

    def unload(self) -> None:
        """Drop the module (pycuda unloads it with its last reference) and free its place."""
        self.functions.clear()
        self.module = None
        gc.collect()

    def prepare(self, case: str) -> None:
        """Raise dynamic shared memory limits; a request the GPU cannot grant is a resource limit."""
        limit = self.device.facts["smem_per_block_optin"]
        for launch in self.launches_by_case[case]:
            total = launch.shared + int(self.static_shared.get(launch.entry, 0))
            if total > limit:
                raise KernelFault(Reason.RESOURCE_LIMIT,
                                  f"{launch.entry} asks for {total} bytes of shared memory; the GPU allows {limit}")
            # The attribute is the function's limit, not a grant per size: setting it for a case that asks
            # less lowers it for every larger case after (65,520 bytes set after 65,536 made the next
            # 65,536-byte launch fail "invalid argument"), so it is only ever raised.
            if launch.shared > max(48 * 1024, self._raised.get(launch.entry, 0)):
                attr = self.device.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES
                try:
                    self.functions[launch.entry].set_attribute(attr, launch.shared)
                except self.device.drv.Error as exc:
                    raise KernelFault(Reason.RESOURCE_LIMIT, f"{launch.entry}: {exc}") from None
                self._raised[launch.entry] = launch.shared

    def launch(self, case: str, pointers: dict[str, int], extents: dict[str, tuple[int, str]] | None = None) -> None:
        """Run the case's launches on the named buffers; `extents` (bytes and dtype by name) are
        needed where a launch passes a tensor map."""
        for index, launch in enumerate(self.launches_by_case[case]):
            words = self._words(case, index, launch, pointers, extents or {})
            try:
                self.functions[launch.entry](*words, block=launch.block, grid=launch.grid, shared=launch.shared)
            except self.device.drv.Error as exc:
                raise KernelFault(_classify_cuda_error(str(exc)), f"launch of {launch.entry} failed: {exc}") from None

    def _words(self, case: str, index: int, launch: ResolvedLaunch, pointers: dict[str, int],
               extents: dict[str, tuple[int, str]]) -> list[Any]:
        """The launch's whole parameter buffer, as pycuda arguments; kept per buffer address, so a
        tensor map is encoded once for the buffers it maps, not on every (timed) launch."""
        key = (case, index, tuple(pointers[value] for kind, value, _ in launch.args if kind != "scalar"))
        words = self._packed.get(key)
        if words is not None:
            return words
        maps = {}
        declared = self.parameters.get(launch.entry)
        try:
            parameter_layout(launch.args, declared, launch.entry)  # a tensor map needs a place first
            for position, (kind, name, spec) in enumerate(launch.args):
                if kind != "tensor_map":
                    continue
                if name not in extents:
                    raise TensorMapError(f"tensor map over '{name}': the runner knows no size for that buffer")
                nbytes, dtype = extents[name]
                check_tensor_map_buffer(name, spec, pointers[name], nbytes, dtype)
                maps[position] = encode_tensor_map(name, spec, pointers[name])
        except TensorMapError as exc:
            raise KernelFault(Reason.PLAN_ERROR, f"{launch.entry}: {exc}") from None
        words = as_pycuda_words(pack_parameters(launch.args, pointers, maps, declared, launch.entry))
        if len(self._packed) >= PACKED_CACHE:
            self._packed.clear()
        self._packed[key] = words
        return words


class CaseBuffers:
    """Guarded inputs, outputs and scratch for one case and one kernel; reused across seeds."""

    def __init__(self, correctness, torch, outputs: dict[str, tuple[tuple[int, ...], Any]],
                 scratch: list[dict[str, Any]], device: str = "cuda"):
        self.c = correctness
        self.made = 0  # buffers made so far: the next one's index, which picks its poison patterns
        self.inputs: dict[str, Any] = {}
        self.outputs = {name: correctness.guarded_empty(shape, dtype, device, self._index())
                        for name, (shape, dtype) in outputs.items()}
        self.scratch = {s["name"]: (correctness.guarded_empty((s["count"],), getattr(torch, s["dtype"]), device,
                                                              self._index()), s["init"])
                        for s in scratch}

    def _index(self) -> int:
        self.made += 1
        return self.made - 1

    def load_inputs(self, values: dict[str, Any]) -> None:
        for name, tensor in values.items():
            current = self.inputs.get(name)
            if current is None or current.data.shape != tensor.shape or current.data.dtype != tensor.dtype:
                self.inputs[name] = self.c.guarded_like(tensor, self._index())
            else:
                current.data.copy_(tensor)  # same pointer, new contents: defeats pointer-keyed caches

    def reset(self) -> None:
        """Poison outputs and initialise scratch before every run of the plan."""
        for buffer in self.outputs.values():
            buffer.poison()
        for buffer, init in self.scratch.values():
            if init == "zero":
                buffer.data.zero_()
            else:
                buffer.poison()

    def pointers(self) -> dict[str, int]:
        named = {**self.inputs, **self.outputs, **{k: v for k, (v, _) in self.scratch.items()}}
        return {name: buffer.data_ptr() for name, buffer in named.items()}

    def extents(self) -> dict[str, tuple[int, str]]:
        """Bytes and dtype of each buffer's data (guards excluded): what a tensor map may span."""
        named = {**self.inputs, **self.outputs, **{k: v for k, (v, _) in self.scratch.items()}}
        return {name: (buffer.data.numel() * buffer.data.element_size(), str(buffer.data.dtype).removeprefix("torch."))
                for name, buffer in named.items()}

    def damaged_guards(self) -> list[str]:
        named = {**self.inputs, **self.outputs, **{k: v for k, (v, _) in self.scratch.items()}}
        return [name for name, buffer in named.items() if not buffer.guards_intact()]


def _output_specs(problem, params: dict[str, Any], torch) -> dict[str, tuple[tuple[int, ...], Any]]:
    specs = {}
    for out in problem.info.outputs:
        shape, dtype = out.resolve(params)
        specs[out.name] = (shape, getattr(torch, dtype))
    return specs


def check_case(device: Device, problem, kernel: LoadedKernel, case_name: str, seeds: list[int],
               result: dict[str, Any]) -> bool:
    """Correctness of one kernel on one case over several seeds. Appends to result; True if it passed."""
    import klineage.gate.correctness as c
    from klineage.problem import RunToRun, tolerance_for

    torch = device.torch
    bitwise = problem.info.run_to_run is RunToRun.BITWISE
    case = problem.info.case(case_name)
    params = dict(case.params)
    kernel.prepare(case_name)
    buffers = CaseBuffers(c, torch, _output_specs(problem, params, torch), kernel.scratch_by_case.get(case_name, []))
    earlier: list[dict[str, Any]] = []
    record = {"case": case_name, "kernel": kernel.role, "seeds": [], "passed": True}
    result["correctness"].append(record)
    findings = result["findings"]

    def fail(reason: Reason, message: str, **evidence: Any) -> bool:
        record["passed"] = False
        findings.append(_finding(reason, "correctness", message, case_name, kernel=kernel.role, **evidence))
        return False

    for seed in seeds:
        device.progress.emit(stage="correctness", case=case_name, seed=seed, kernel=kernel.role)
        fresh = problem.make_inputs(dict(params), seed, "cuda")
        buffers.load_inputs(fresh)
        pristine = {k: v.data.clone() for k, v in buffers.inputs.items()}
        expected = problem.reference({k: v.clone() for k, v in pristine.items()}, params)
        seed_record: dict[str, Any] = {"seed": seed, "outputs": {}}
        record["seeds"].append(seed_record)
        first: dict[str, Any] = {}
        for attempt in (1, 2):  # reference -> candidate -> candidate again
            buffers.reset()
            kernel.launch(case_name, buffers.pointers(), buffers.extents())
            device.synchronize(f"{kernel.role} {case_name} seed {seed} run {attempt}")
            damaged = buffers.damaged_guards()
            if damaged:
                return fail(Reason.OUT_OF_BOUNDS_WRITE, f"wrote outside buffer(s) {', '.join(damaged)}", seed=seed)
            modified = c.inputs_unchanged(pristine, {k: v.data for k, v in buffers.inputs.items()})
            if modified:
                return fail(Reason.INPUT_MODIFIED, f"modified input(s) {', '.join(modified)}", seed=seed)
            again = "on a second run on the same inputs, " if attempt == 2 else ""
            for name, buffer in buffers.outputs.items():
                got = buffer.data
                if attempt == 2 and bitwise:
                    if not c.same_bits(first[name], got):
                        return fail(Reason.NONDETERMINISTIC, f"output '{name}' differs between two runs on the same "
                                    f"inputs in {c.differing(first[name], got)} elements", seed=seed)
                    continue
                if bitwise:
                    first[name] = got.clone()
                # within tolerance, the second run is judged against the reference like the first, below
                if problem.check is not None:  # the problem defines "right" itself (e.g. ties in top-k)
                    # Integer poison is a legal value, so only float outputs can be judged unwritten here.
                    unwritten = int(c.poisoned_mask(got).sum()) if got.dtype.is_floating_point else 0
                    if unwritten:
                        return fail(Reason.UNWRITTEN_OUTPUT, f"{again}output '{name}': {unwritten} elements never "
                                    f"written", seed=seed)
                    continue
                tol = tolerance_for(str(got.dtype).removeprefix("torch."), problem.info.tolerances, name)
                comparison = c.compare(name, got, expected[name], tol)
                seed_record["outputs"].setdefault(name, comparison.to_dict())  # the first run's, as always
                if not comparison.passed:
                    stale = c.stale_match(got, [e[name] for e in earlier], tol)
                    if stale is not None:
                        return fail(Reason.STALE_OUTPUT, f"output '{name}' equals the answer for an earlier input "
                                    f"(seed {seeds[stale]}): results are cached across calls", seed=seed)
                    details = comparison.to_dict()
                    return fail(comparison.reason, again + comparison.message, seed=seed,
                                worst_index=details["worst_index"], max_abs_err=details["max_abs_err"],
                                rel_l2=details["rel_l2"])
            if problem.check is not None and (attempt == 1 or not bitwise):
                message = problem.check(params, pristine, {n: b.data for n, b in buffers.outputs.items()}, expected)
                seed_record.setdefault("check", message or "passed")
                if message:
                    return fail(Reason.INCORRECT, f"{again}problem check: {message}", seed=seed)
        earlier.append(expected)
    return True


def check_vendor(device: Device, problem, case_name: str, seed: int) -> dict[str, Any]:
    import klineage.gate.correctness as c
    from klineage.problem import tolerance_for

    params = dict(problem.info.case(case_name).params)
    inputs = problem.make_inputs(params, seed, "cuda")
    expected = problem.reference({k: v.clone() for k, v in inputs.items()}, params)
    got = problem.vendor({k: v.clone() for k, v in inputs.items()}, params)
    checks = {}
    for name in expected:
        tol = tolerance_for(str(expected[name].dtype).removeprefix("torch."), problem.info.tolerances, name)
        checks[name] = c.compare(name, got[name].to(expected[name].dtype), expected[name], tol).to_dict()
    return {"case": case_name, "outputs": checks, "passed": all(v["passed"] for v in checks.values())}


def _timed_output_problem(c, problem, params, inputs, outputs, expected) -> str | None:
    from klineage.problem import tolerance_for

    if problem.check is not None:
        return problem.check(params, inputs, outputs, expected)
    for name, got in outputs.items():
        tol = tolerance_for(str(got.dtype).removeprefix("torch."), problem.info.tolerances, name)
        comparison = c.compare(name, got, expected[name], tol)
        if not comparison.passed:
            return comparison.message
    return None


def _capture_vendor_graphs(torch, problem, params: dict[str, Any], sets: list[dict[str, Any]],
                           notes: list[str]) -> dict[int, Any]:
    """One CUDA graph of the vendor call per input set, captured after eager calls (autotuning,
    compilation and lazy allocations must not happen inside a capture). A vendor path that cannot
    be captured (a host sync, a CPU tensor) is noted and timed eagerly only: not the candidate's fault."""
    graphs = {}
    try:
        for s in sets:
            for _ in range(2):
                problem.vendor(s["inputs"], params)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                problem.vendor(s["inputs"], params)
            graphs[id(s)] = graph
        torch.cuda.synchronize()
    except Exception as exc:  # any capture failure: report it, keep the eager timing
        torch.cuda.synchronize()
        notes.append(f"vendor not timed from a CUDA graph: {type(exc).__name__}: {exc}"[:400])
        return {}
    return graphs


def _timed_launch(kernel: LoadedKernel, case_name: str):
    """For a set of inputs: what resets the kernel's outputs, and its launch on that set's buffers."""
    def on(s):
        buffers = s["buffers"][kernel.role]
        pointers, extents = buffers.pointers(), buffers.extents()
        return (lambda: buffers.reset()), (lambda: kernel.launch(case_name, pointers, extents))
    return on


def profile(device: Device, problem, kernels: list[LoadedKernel], case_name: str, policy: dict[str, Any],
            result: dict[str, Any]) -> None:
    """Time candidate, baseline and vendor interleaved on fresh inputs, L2 flushed before each call.
    A timing that does not settle is measured again after warming the clocks, with more trials; the
    settle check of each attempt goes into the profile, and only a settled one may decide anything."""
    import klineage.gate.correctness as c
    from klineage.gate.timing import (
        RETRY_TRIALS,
        PairedRatio,
        Settlement,
        Settling,
        TimingStats,
        cover_s,
        settle_record,
    )

    torch = device.torch
    params = dict(problem.info.case(case_name).params)
    flush = torch.empty(max(2 * device.facts["l2_bytes"], 64 << 20), dtype=torch.uint8, device="cuda")
    sets = []
    for i in range(policy["input_sets"]):
        inputs = problem.make_inputs(dict(params), 100_003 + 7919 * i + int(time.time()) % 1000, "cuda")
        expected = problem.reference({k: v.clone() for k, v in inputs.items()}, params)
        per_kernel = {}
        for kernel in kernels:
            kernel.prepare(case_name)
            buffers = CaseBuffers(
                c, torch, _output_specs(problem, params, torch), kernel.scratch_by_case.get(case_name, [])
            )
            buffers.load_inputs(inputs)
            per_kernel[kernel.role] = buffers
        sets.append({"inputs": inputs, "expected": expected, "buffers": per_kernel})
    host_us: dict[str, list[float]] = {}

    stream = torch.cuda.current_stream()

    def timed_call(role: str, make, s) -> tuple[Any, Any, bool]:
        """Queue one timed call; also whether the host may have been timed (`exposed`)."""
        before, call = make(s)
        # Nothing queued ahead (a round's first call: the host just waited out the last round, and after a
        # long kernel it can be slow to dispatch again): a longer cover, and a dispatch that still outlasts
        # it is marked exposed, since the events may then have timed the host (bench/logs/gpu-session-s21.txt:
        # cuBLAS beside a 149-ms naive GEMM spread 0.94, its trial medians 185 to 244 us).
        idle = stream.query()
        cycles = HOST_COVER_CYCLES * (IDLE_COVER if idle else 1)
        flush.zero_()
        before()
        covered = time.perf_counter()  # before the cover is queued: the GPU cannot start it earlier
        # Keep the GPU busy while the host dispatches the call, so the events time the GPU work
        # and not the host's launch path (which differs between pycuda and a library call).
        torch.cuda._sleep(cycles)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dispatched = time.perf_counter()
        call()
        done = time.perf_counter()
        host_us.setdefault(role, []).append((done - dispatched) * 1e6)
        end.record()
        return start, end, idle and done - covered > cover_s(cycles)

    contenders: list[tuple[str, Any]] = [(kernel.role, _timed_launch(kernel, case_name)) for kernel in kernels]
    notes: list[str] = []
    vendor_launch: dict[str, Any] = {}

    def warm_up(roles: set[str]) -> None:  # module load, autotuning, caches
        for role, make in contenders:
            for i in range(policy["warmup"] if role in roles else 0):
                timed_call(role, make, sets[i % len(sets)])
        device.synchronize(f"warm-up {case_name}")

    if policy["vendor"] and problem.vendor is not None:
        def run_vendor(s):
            return (lambda: None), (lambda: problem.vendor(s["inputs"], params))
        contenders.append(("vendor", run_vendor))
        warm_up({"vendor"})
        vendor_launch = _vendor_launch(host_us.get("vendor", []), VendorTiming.GRAPH in problem.info.vendor_timing)
        if vendor_launch["graph_wanted"]:
            graphs = _capture_vendor_graphs(torch, problem, params, sets, notes)
            vendor_launch["graph"] = "captured" if graphs else notes[-1]
            if graphs:
                contenders.append(("vendor_graph", lambda s: ((lambda: None), graphs[id(s)].replay)))
    warm_up({role for role, _ in contenders if role != "vendor"})
    # exchanged: each round times the kernels once in each arrangement of their places
    arrangements = len(kernels) if policy.get("placement") == "exchanged" else 1
    placed = list(kernels)

    def measure(trials: int) -> tuple[dict[str, list[list[float]]], list[list[str]], dict[str, int]] | None:
        """`trials` rounds of interleaved samples, each trial's load order and each contender's samples
        left out (the host may be in them); None when a timed call's output was wrong (the finding is in
        the result)."""
        nonlocal placed
        orders: list[list[str]] = []
        samples: dict[str, list[list[float]]] = {role: [] for role, _ in contenders}
        exposed: dict[str, int] = {role: 0 for role, _ in contenders}
        for trial in range(trials * arrangements):
            device.progress.emit(stage="profile", case=case_name, trial=trial)
            if trial and arrangements > 1:
                placed = exchange_places(placed, case_name)
                warm_up({k.role for k in placed})  # only the reloaded kernels: the vendor stays warm
            orders.append([k.role for k in placed])
            kept, dropped = _trial_samples(device, contenders, sets, policy, trial, timed_call)
            for role, values in kept.items():
                samples[role].append(values)
                exposed[role] += dropped[role]
            # The timed calls' own outputs must be right: a kernel cannot behave differently when timed.
            for s in sets:
                for kernel in kernels:
                    outputs = {name: b.data for name, b in s["buffers"][kernel.role].outputs.items()}
                    problem_found = _timed_output_problem(c, problem, params, s["inputs"], outputs, s["expected"])
                    if problem_found:
                        result["findings"].append(_finding(Reason.TIMED_OUTPUT_INCORRECT, "profile",
                                                           f"{kernel.role}: {problem_found}", case_name,
                                                           kernel=kernel.role))
                        return None
        return samples, orders, exposed

    attempts: list[Settling] = []
    trials = policy["trials"]
    while True:
        measured = measure(trials)
        if measured is None:
            return
        samples, orders, exposed = measured
        stats = {role: TimingStats.of(values, arrangements) for role, values in samples.items()}
        ratios = {f"vs_{role}": PairedRatio.of(stats["candidate"], s)
                  for role, s in stats.items() if role != "candidate"}
        attempts.append(Settling.of(stats, ratios))
        if attempts[-1].settlement is Settlement.SETTLED or len(attempts) > 1:
            break
        device.progress.emit(stage="profile", case=case_name, what="unsettled: warming the clocks, then more trials")
        _warm_clocks(device)
        trials = min(10, trials * RETRY_TRIALS)
    result["profile"] = {
        "case": case_name,
        "contenders": {role: s.to_dict() for role, s in stats.items()},
        "ratios": {name: r.to_dict() for name, r in ratios.items()},
        "settlement": settle_record(attempts),
        "roofline": _roofline(device, problem, case_name, stats),
        **({"placement": _by_arrangement(orders, samples, arrangements)} if arrangements > 1 else {}),
        **({"vendor_launch": vendor_launch} if vendor_launch else {}),
        **({"host_exposed": {role: n for role, n in exposed.items() if n}} if any(exposed.values()) else {}),
        **({"notes": notes} if notes else {}),
    }


def _trial_samples(device: Device, contenders: list[tuple[str, Any]], sets: list[dict[str, Any]],
                   policy: dict[str, Any], trial: int, timed_call) -> tuple[dict[str, list[float]], dict[str, int]]:
    """One trial: rounds of every contender once, in a rotating order, until the samples settle
    (spread under the target after min_reps), the trial's time is up, or max_reps. Each contender's
    samples, and how many were left out because the host may be in them (`timing.keep_covered`)."""
    from klineage.gate.timing import keep_covered, spread

    covered: dict[str, list[float]] = {role: [] for role, _ in contenders}
    exposed: dict[str, list[float]] = {role: [] for role, _ in contenders}

    def kept() -> dict[str, list[float]]:
        return {role: keep_covered(covered[role], exposed[role]) for role in covered}

    started = time.monotonic()
    rep = 0
    while rep < policy["max_reps"]:
        order = contenders[rep % len(contenders):] + contenders[:rep % len(contenders)]
        events = [(role, timed_call(role, make, sets[rep % len(sets)])) for role, make in order]
        device.synchronize(f"timed round {rep} of trial {trial}")
        for role, (start, end, host_seen) in events:
            (exposed if host_seen else covered)[role].append(start.elapsed_time(end) * 1000.0)
        rep += 1
        if rep >= policy["min_reps"] and rep % 5 == 0:
            settled = all(spread(v) < policy["spread_target"] for v in kept().values())
            if settled or time.monotonic() - started > policy["trial_seconds"]:
                break
    samples = kept()
    return samples, {role: len(covered[role]) + len(exposed[role]) - len(samples[role]) for role in samples}


def _vendor_launch(host_us: list[float], declared: bool) -> dict[str, Any]:
    """How long the host takes to dispatch one eager vendor call (over the warm-up calls), and whether
    the vendor is also timed from a CUDA graph: where the problem asks for it, or where the dispatch
    outlasts half the GPU work that covers it (the events would then time the host too)."""
    median = statistics.median(host_us) if host_us else 0.0
    host_bound = median > HOST_BOUND_US
    return {"host_us_median": round(median, 2), "host_bound": host_bound, "graph_wanted": declared or host_bound,
            "graph": "not wanted"}


def _warm_clocks(device: Device) -> None:
    """Busy work on every SM for WARM_CLOCKS_S, so the next measurement starts at the clocks the GPU
    holds under load (a first gate after the machine started timed the vendor at 3x its settled time)."""
    torch = device.torch
    # no random numbers: after a vendor's failed graph capture the CUDA generator refuses to advance
    a = torch.full((4096, 4096), 0.5, dtype=torch.float16, device="cuda")
    started = time.monotonic()
    while time.monotonic() - started < WARM_CLOCKS_S:
        for _ in range(8):
            a = torch.nn.functional.normalize(a @ a, dim=1).to(torch.float16)
        device.synchronize("warming the clocks")


def _roofline(device: Device, problem, case_name: str, stats: dict[str, Any]) -> dict[str, Any]:
    from klineage import devices
    from klineage.gate.timing import roofline_floor_us

    figures = problem.info.roofline[case_name]
    try:
        spec = devices.lookup(device.name)
    except Exception:
        spec = devices.DEFAULT
    floor = roofline_floor_us(figures["flops"], figures["bytes"], spec.flops_per_s.get(problem.info.math, 0.0),
                              spec.dram_bytes_per_s)
    return {"floor_us": floor, "flops": figures["flops"], "bytes": figures["bytes"],
            "fraction": {role: floor / s.median_us for role, s in stats.items()}, "device_spec": spec.name}


def exchange_places(placed: list[LoadedKernel], case_name: str) -> list[LoadedKernel]:
    """Unload the kernels in load order and load them again rotated by one, so each takes the
    place of the kernel loaded before it (the first the last's). The driver hands freed places out
    first freed, first reused (bench/logs/gpu-session-s15.txt: unloading A then B and loading B
    then A swapped their times, 515/378 us for 525/377; unloading in the reverse order did not)."""
    for kernel in placed:
        kernel.unload()
    rotated = placed[1:] + placed[:1]
    for kernel in rotated:
        kernel.load()
        kernel.prepare(case_name)
    return rotated


def _by_arrangement(orders: list[list[str]], samples: dict[str, list[list[float]]], arrangements: int) -> dict:
    """Each arrangement's load order and each contender's median in it: how far places moved the times."""
    return {"arrangements": orders[:arrangements],
            "medians_us": {role: [statistics.median([v for t in trials[k::arrangements] for v in t])
                                  for k in range(arrangements)] for role, trials in samples.items()}}


class Phases:
    """Seconds spent per phase of the run, reported with the result: where a gate's time goes."""

    def __init__(self, result: dict[str, Any]):
        self.seconds: dict[str, float] = result.setdefault("phases", {})
        self._clock = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._clock, 4)
        self._clock = now


def run(request: dict[str, Any], result: dict[str, Any], progress: Progress) -> None:
    from klineage.problem_formats import load_problem

    phases = Phases(result)
    problem = load_problem(request["problem"])
    phases.lap("load_problem")
    device = Device(progress)
    try:
        result["environment"] = device.environment()
        phases.lap("device")
        _run_on(device, problem, request, result, phases)
    finally:
        device.close()


VENDOR_SEED = 4242  # the vendor path is checked on one seed a case: it is the yardstick, not the candidate


def _run_on(device: Device, problem, request: dict[str, Any], result: dict[str, Any], phases: Phases,
            vendor_checks: dict[str, dict[str, Any]] | None = None) -> None:
    """Judge one request's candidate. `vendor_checks`: a warm runner's vendor checks by case, kept
    across its candidates (the check judges the vendor path on fixed inputs, so it is made once a
    case per runner; a cold runner makes it for its one candidate)."""
    kernels = [LoadedKernel(device, spec) for spec in request["kernels"]]
    phases.lap("load_kernels")
    candidate = kernels[0]
    policy = request["policy"]
    cases = request["cases"]
    passed = True
    for case_name in cases:
        try:
            passed = check_case(device, problem, candidate, case_name, request["seeds"], result) and passed
        except KernelFault as fault:
            result["findings"].append(_finding(fault.reason, "correctness", str(fault), case_name, kernel="candidate"))
            return  # the context may be dead; nothing more can be trusted in this process
    phases.lap("correctness")
    if request["mode"] == "sanitize" or not passed:
        return
    timing_case = request.get("timing_case")
    # The vendor is checked where it is a yardstick: an untimed gate compares nothing with it (and
    # GDN's vendor, Triton kernels built in each new process, took 110-140 s of a 150-s state gate).
    if problem.vendor is not None and policy["vendor"] and timing_case:
        checked = {} if vendor_checks is None else vendor_checks
        for case_name in cases:
            if case_name not in checked:
                checked[case_name] = check_vendor(device, problem, case_name, VENDOR_SEED)
        result["vendor_check"] = [checked[case_name] for case_name in cases]
        phases.lap("vendor_check")
    if timing_case:
        for baseline in kernels[1:]:  # a baseline must itself be right before it is a yardstick
            try:
                if not check_case(device, problem, baseline, timing_case, request["seeds"][:1], result):
                    result["findings"].append(_finding(Reason.UNKNOWN, "profile", "the baseline kernel is incorrect",
                                                       timing_case, kernel=baseline.role))
                    return
            except KernelFault as fault:
                result["findings"].append(_finding(Reason.UNKNOWN, "profile", f"baseline failed: {fault}", timing_case))
                return
        try:
            profile(device, problem, kernels, timing_case, policy, result)
        except KernelFault as fault:
            result["findings"].append(_finding(fault.reason, "profile", str(fault), timing_case))
        phases.lap("profile")
        if request.get("timing_cases") and not result["findings"]:
            time_every_case(device, problem, kernels, request["timing_cases"], policy, request["seeds"][:1], result)
            phases.lap("profile_every_case")


def time_every_case(device: Device, problem, kernels: list[LoadedKernel], cases: list[str], policy: dict[str, Any],
                    seeds: list[int], result: dict[str, Any]) -> None:
    """Time the kernels on each of `cases` as `profile` timed the headline (already in result["profile"]),
    each case's profile under profile["per_case"]. A baseline wrong on a case (a sweep case its
    problem never judged it on) leaves that case untimed, with the reason; the candidate's own timed
    outputs are checked on every case, and a wrong one is a finding naming the case, as on the headline."""
    headline = result["profile"].get("case")
    per_case: dict[str, Any] = {headline: {k: v for k, v in result["profile"].items() if k != "per_case"}} \
        if headline else {}
    result["profile"]["per_case"] = per_case
    for case_name in cases:
        if case_name in per_case:
            continue
        try:
            wrong = [b.role for b in kernels[1:] if
                     not check_case(device, problem, b, case_name, seeds, {"correctness": [], "findings": []})]
            if wrong:
                per_case[case_name] = {"untimed": f"the {', '.join(wrong)} kernel is incorrect on this case"}
                continue
            own: dict[str, Any] = {"findings": [], "profile": {}}
            profile(device, problem, kernels, case_name, policy, own)
        except KernelFault as fault:  # the context may be dead: nothing more is timed in this process
            result["findings"].append(_finding(fault.reason, "profile", str(fault), case_name))
            return
        result["findings"].extend(own["findings"])
        per_case[case_name] = own["profile"] or {"untimed": "its timed outputs were wrong (see the findings)"}


def probe(request: dict[str, Any], result: dict[str, Any]) -> None:
    """Load and validate a problem file; report its info and the input names the plan can use."""
    from klineage.problem import validate_numerics
    from klineage.problem_formats import load_problem

    problem = load_problem(request["problem"])
    device = "cuda" if request.get("device") == "cuda" else "cpu"
    result["problem"] = problem.info.to_dict()
    result["numerics"] = validate_numerics(problem, device)
    smallest = min(problem.info.cases, key=lambda case: sum(
        v for v in case.params.values() if isinstance(v, int) and not isinstance(v, bool)))
    sample = problem.make_inputs(dict(smallest.params), 0, device)
    result["inputs"] = {name: {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
                        for name, t in sample.items()}


def serve(request: dict[str, Any], progress: Progress) -> None:
    """A warm runner (klineage.gate.warm): load the problem and create the context once, then judge
    the jobs that appear in the inbox as 0.json, 1.json, ... in order, each result in the outbox under
    the same name and each job's printed output in its own file. It ends at a `stop` file in the
    inbox, or after a job that found anything or failed: a fault may have left the context broken
    (the parent judges such a candidate again in a cold runner)."""
    from klineage.problem import load_problem

    problem = load_problem(request["problem"])
    device = Device(progress)
    vendor_checks: dict[str, dict[str, Any]] = {}  # made once a case for every candidate this runner judges
    inbox, outbox = Path(request["inbox"]), Path(request["outbox"])
    try:
        progress.emit(what="ready")
        for number in itertools.count():
            job_path = inbox / f"{number}.json"
            while not job_path.is_file():
                if (inbox / "stop").exists():
                    return
                time.sleep(0.02)
            job = json.loads(job_path.read_text(encoding="utf-8"))
            done: dict[str, Any] = {"findings": [], "correctness": [], "profile": {}}
            with _output_to(Path(job["output"])):
                _judge_job(device, problem, job, done, vendor_checks)
            gc.collect()  # the job's modules and buffers go with it
            _write_result(outbox / f"{number}.json", done)
            if done["findings"] or "error" in done:
                return
    finally:
        device.close()


def _judge_job(device: Device, problem, job: dict[str, Any], result: dict[str, Any],
               vendor_checks: dict[str, dict[str, Any]]) -> None:
    """One candidate in a warm runner: what `run` does after loading the problem and the device."""
    def work() -> None:
        result["environment"] = device.environment()  # this job's clocks, not the runner's first
        _run_on(device, problem, job, result, Phases(result), vendor_checks)

    _reported(result, work)


def _reported(result: dict[str, Any], work) -> None:
    """Run `work`: a kernel fault becomes a finding, any other failure the result's error."""
    try:
        work()
    except KernelFault as fault:
        result["findings"].append(_finding(fault.reason, "run", str(fault)))
    except Exception as exc:  # the harness or the problem failed: report it, never guess a verdict
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-8000:]


@contextlib.contextmanager
def _output_to(path: Path):
    """Send what this process prints (kernel printf included: it goes to file descriptor 1) to `path`
    while a job runs, so the parent can hold each job to the output cap."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with path.open("wb") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)


def _write_result(path: Path, result: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(result), encoding="utf-8")
    os.replace(temporary, path)


def main(argv: list[str]) -> int:
    request = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    result_path = Path(argv[2])
    progress = Progress(request.get("progress"))
    result: dict[str, Any] = {"findings": [], "correctness": [], "profile": {}}
    modes = {"probe": lambda: probe(request, result), "serve": lambda: serve(request, progress)}
    _reported(result, modes.get(request["mode"], lambda: run(request, result, progress)))
    _write_result(result_path, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
