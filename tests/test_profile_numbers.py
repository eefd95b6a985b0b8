"""The numbers that DESIGN §6 and the quantize kernel's docstring quote from the committed Nsight
Compute profile of the layer's quantize steps are that profile's, and the floor they derive
from it follows from them."""

from __future__ import annotations

import json
import statistics
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "results" / "microbench" / "gpu" / "profile_quantize_16384x8192.txt"
# The copy rate the floor is set against: the same-run ceiling of the A/B file DESIGN §6 cites.
AB = ROOT / "results" / "microbench" / "gpu" / "history" / "quantize-ab-fixup-launch-2026-12-03.json"
DESIGN = ROOT / "docs" / "DESIGN.md"
KERNEL = ROOT / "kernels" / "hadamard_quantize.py"
VALUES = 16384 * 8192
SCHEDULERS = 132 * 4  # an H200: 132 SMs, 4 schedulers each, one warp-instruction a cycle apiece
# Minimal bytes a bf16 value: read 2; X writes seg128 FP8 along K and packed codes along M, W tile128
# FP8 both ways, dY seg128 FP8 both ways (the kernel docstring's per-output figures).
STEPS = {"X": 2 + (1 + 1 / 32) + (0.5 + 1 / 32), "W": 2 + 2 * (1 + 1 / 4096), "dY": 2 + 2 * (1 + 1 / 32)}


def metric(section: str, name: str) -> float:
    """The first value of metric ``name`` in a kernel's section of ``ncu --print-details``."""
    m = re.search(rf"^\s+{re.escape(name)}\s+(?:[^\s\d][^\s]*\s+)?([\d,]+(?:\.\d+)?)\s*$", section, re.M)
    assert m, f"{PROFILE.name}: no {name!r} in a kernel's section"
    return float(m[1].replace(",", ""))


def records(path: Path) -> list[dict]:
    """The ``records`` list of a results file (JSON with ``provenance`` and ``records``)."""
    return json.loads(path.read_text())["records"]


def prose(path: Path) -> str:
    """The file's text with line breaks, comment marks and runs of spaces folded to one space."""
    return re.sub(r"\s+", " ", re.sub(r"^\s*#", " ", path.read_text(), flags=re.M))


@pytest.fixture(scope="module")
def profiled() -> dict[str, dict[str, float]]:
    sections = re.split(r"^  _hadamard_quantize_kernel ", PROFILE.read_text(), flags=re.M)[1:]
    assert len(sections) == len(STEPS), f"{PROFILE.name}: {len(sections)} kernels, expected X, W and dY"
    names = ("Duration", "Instructions Executed", "Issue Slots Busy", "ALU", "DRAM Throughput",
             "Achieved Occupancy", "Registers Per Thread", "SM Frequency")
    return {step: {n: metric(s, n) for n in names} for step, s in zip(STEPS, sections)}


def listed(values: list[str]) -> str:
    """``"a, b and c"``: how the prose lists the three steps' figures."""
    return ", ".join(values[:-1]) + f" and {values[-1]}"


def per_value(p: dict[str, float]) -> float:
    return p["Instructions Executed"] / VALUES


def floors(profiled) -> dict[str, tuple[float, float]]:
    """Per step: µs the instructions take issued on every cycle, µs the minimal bytes take at copy rate."""
    copy = {r["ceiling"] for r in records(AB) if r["ceiling_name"] == "copy"}
    assert len(copy) == 1, f"{AB.name}: one copy rate expected, got {copy}"
    gbs = copy.pop()
    return {step: (p["Instructions Executed"] / SCHEDULERS / (p["SM Frequency"] * 1e3), VALUES * STEPS[step] / (gbs * 1e3))
            for step, p in profiled.items()}


def test_design_table_rows_are_the_profiles(profiled):
    rows = {m[1]: m[0] for m in re.finditer(r"^\s*\| (X|W|dY)[:,].*\|$", DESIGN.read_text(), re.M)}
    assert set(rows) == set(STEPS), f"DESIGN §6: profile rows {sorted(rows)}"
    for step, p in profiled.items():
        cells = [f"| {p['Duration']:.0f} µs | {per_value(p):.2f} | {p['Issue Slots Busy']:.1f}% |",
                 f" {p['ALU']:.0f}% | {p['DRAM Throughput']:.1f}%", f"| {p['Achieved Occupancy']:.0f}% ({p['Registers Per Thread']:.0f}"]
        for cell in cells:
            assert cell in rows[step], f"DESIGN §6, row {step}: {cell!r} not in {rows[step]!r}"


def test_design_and_docstring_floors_follow_from_the_profile(profiled):
    f = floors(profiled).values()
    issue = listed([f"{at_issue:.0f}" for at_issue, _ in f])
    copy = listed([f"{at_copy:.0f}" for _, at_copy in f])
    share = listed([f"{at_copy / at_issue:.2f}" for at_issue, at_copy in f])
    counts = listed([f"{per_value(p):.2f}" for p in profiled.values()])
    design, kernel = prose(DESIGN), prose(KERNEL)
    for text in (f"take {issue} µs", f"against {copy} µs", f"reach {share} of copy"):
        assert text in design, f"DESIGN §6 does not say {text!r}"
    for text in (f"{counts} warp-instructions", f"at {share} of copy"):
        assert text in kernel, f"{KERNEL.name}'s docstring does not say {text!r}"


H100_PROFILE = ROOT / "results" / "microbench" / "gpu" / "profile_quantize_16384x8192_h100.txt"
H100_NAMES = ("Duration", "Issue Slots Busy", "DRAM Throughput", "Eligible Warps Per Scheduler",
              "Achieved Occupancy", "Registers Per Thread")


def h100_metrics(section: str) -> dict[str, float]:
    """A kernel's figures of the H100 profile; the ALU pipe's % of elapsed cycles is the figure of
    ncu's rule that names it the busiest pipe (the profile prints no pipe table)."""
    m = re.search(r"ALU is the highest-utilized pipeline \(([\d.]+)%\)", section)
    assert m, f"{H100_PROFILE.name}: no ALU share in a kernel's section"
    return ({n: metric(section, n) for n in H100_NAMES}
            | {"ALU": float(m[1]), "Instructions Executed": metric(section, "Executed Instructions")})


def test_design_h100_rows_are_the_h100_profile():
    """DESIGN §6's second table: the kernel as it is now, profiled on an H100."""
    sections = re.split(r"^  _hadamard_quantize_kernel ", H100_PROFILE.read_text(), flags=re.M)[1:]
    assert len(sections) == len(STEPS), f"{H100_PROFILE.name}: {len(sections)} kernels, expected X, W and dY"
    rows = {m[1]: m[0] for m in re.finditer(r"^\s*\| H100 (X|W|dY)[:,].*\|$", DESIGN.read_text(), re.M)}
    assert set(rows) == set(STEPS), f"DESIGN §6: H100 profile rows {sorted(rows)}"
    for step, section in zip(STEPS, sections):
        p = h100_metrics(section)
        cell = (f"| {p['Duration']:.0f} µs | {p['Instructions Executed'] / VALUES:.2f} | {p['Issue Slots Busy']:.1f}% "
                f"| {p['ALU']:.0f}% | {p['DRAM Throughput']:.1f}% | {p['Eligible Warps Per Scheduler']:.2f} "
                f"| {p['Achieved Occupancy']:.0f}% ({p['Registers Per Thread']:.0f} registers) |")
        assert cell in rows[step], f"DESIGN §6, H100 row {step}: {cell!r} not in {rows[step]!r}"


def test_design_h100_quantize_step_rates_are_the_results_file():
    """Per benchmark the better of the two committed runs."""
    runs = [{r["test"]: r for r in records(ROOT / "results" / "microbench" / "gpu" / f"{name}.json")}
            for name in ("quantize-steps", "quantize-steps-rerun")]
    assert runs[0].keys() == runs[1].keys(), "both runs time the same steps and shapes"
    recs = [max((run[test] for run in runs), key=lambda r: r["ratio"]) for test in runs[0]]
    rne = [r["ratio"] for r in recs if r["op"].endswith("rounding=rne")]
    sr = [r["ratio"] for r in recs if r["op"].endswith("rounding=sr")]
    gbs = [r["figure"] for r in recs]
    assert len(rne) + len(sr) == len(recs) and rne and sr
    design = prose(DESIGN)
    for text in (f"run at {min(gbs):.0f}–{max(gbs):.0f} GB/s on the H100",
                 f"so {min(rne):.2f}–{max(rne):.2f} of the H100's copy rate with RNE and {min(sr):.2f}–{max(sr):.2f} with SR"):
        assert text in design, f"DESIGN §6 does not say {text!r}"
    w_short = " and ".join(f"{run['test_layer_quantize_step[llama3.2-1b-hidden-16k-W]']['ratio']:.2f}" for run in runs)
    assert f"differ most (W {w_short})" in design


def test_design_and_docstring_quantize_ab_ratios_are_the_results_file():
    """The same-run A/B of the two-kernel quantize against the kernel before it: per step, the
    range of its speed ratios over the shapes, and every shape wrote the same bytes."""
    recs = records(ROOT / "results" / "microbench" / "gpu" / "quantize-ab.json")
    assert recs and all(r["same_bytes"] for r in recs)
    spans = {}
    for step, name in (("X", "X-forward"), ("W", "W"), ("dY", "dY-backward-sr")):
        ratios = [r["ratio_to_peers"]["baseline"] for r in recs if r["test"].startswith(name + "[")]
        spans[step] = (min(ratios), max(ratios))
    text = ", ".join(f"{step} {lo:.2f}–{hi:.2f}×" for step, (lo, hi) in spans.items())
    assert text in prose(DESIGN), f"DESIGN §6 does not say {text!r}"
    lo = min(lo for lo, _ in spans.values())
    hi = max(hi for _, hi in spans.values())
    assert f"{lo:.2f}-{hi:.2f}x" in prose(KERNEL), f"{KERNEL.name} does not say {lo:.2f}-{hi:.2f}x"


def test_design_and_docstring_instruction_ab_ratios_are_the_results_files():
    """The A/B of the kernel with fewer instructions a value, two runs: dY's speed ratio range at the
    three longer shapes, X's and W's there, and the shortest shape's W ratios."""
    recs = [r for name in ("quantize-ab-instr.json", "quantize-ab-instr-rerun.json")
            for r in records(ROOT / "results" / "microbench" / "gpu" / name)]
    assert recs and all(r["same_bytes"] for r in recs)
    short = [r for r in recs if r["shape"] == [16384, 2048]]
    longer = [r for r in recs if r["shape"] != [16384, 2048]]
    assert {tuple(r["shape"]) for r in longer} == {(16384, 8192), (16384, 4096), (65536, 768)}
    dy = [r["ratio_to_peers"]["baseline"] for r in longer if r["test"].startswith("dY-backward-sr[")]
    xw = [r["ratio_to_peers"]["baseline"] for r in longer if not r["test"].startswith("dY")]
    w_short = ", then ".join(f"{r['ratio_to_peers']['baseline']:.2f}x" for r in short if r["test"].startswith("W["))
    design = prose(DESIGN)
    assert f"sped the SR step {min(dy):.2f}–{max(dy):.2f}× against" in design
    assert f"left X and W at {min(xw):.2f}–{max(xw):.2f}×" in design
    kernel = prose(KERNEL)
    assert f"sped the SR step (dY) {min(dy):.2f}-{max(dy):.2f}x on an H100" in kernel
    assert f"with X and W at {min(xw):.2f}-{max(xw):.2f}x" in kernel and f"(W {w_short})" in kernel


def test_design_and_docstring_f16x2_tail_ab_ratios_are_the_results_files():
    """The A/B of the f16x2 RNE tails, three runs: per step the median ratio at each of the three
    longer shapes, their range; at the shortest shape X's range over the runs; every run wrote the
    same bytes as the kernel before."""
    runs = [records(ROOT / "results" / "microbench" / "gpu" / f"quantize-ab-e5m2-pairs{suffix}.json")
            for suffix in ("", "-rerun2", "-rerun3")]
    assert all(recs and all(r["same_bytes"] for r in recs) for recs in runs)
    by_test: dict[str, list[float]] = {}
    for recs in runs:
        for r in recs:
            by_test.setdefault(r["test"], []).append(r["ratio_to_peers"]["baseline"])
    assert all(len(v) == len(runs) for v in by_test.values()), "every run times every step and shape"
    longer = ("llama3.2-1b-mlp-16k", "llama3-8b-hidden-16k", "ours-125m-hidden-64k")
    span = {}
    for step, name in (("X", "X-forward"), ("W", "W"), ("dY", "dY-backward-sr")):
        medians = [statistics.median(by_test[f"{name}[{shape}]"]) for shape in longer]
        span[step] = f"{min(medians):.2f}-{max(medians):.2f}x"
    short = by_test["X-forward[llama3.2-1b-hidden-16k]"]
    kernel = prose(KERNEL)
    for text in (f"was X {span['X']}, W {span['W']} and the SR step, which they do not touch, {span['dY']};",
                 f"(X {min(short):.2f}x to {max(short):.2f}x)"):
        assert text in kernel, f"{KERNEL.name} does not say {text!r}"
    text = f"sped X {span['X']} and W {span['W']} (median of three".replace("x", "×").replace("-", "–")
    assert text in prose(DESIGN), f"DESIGN §6 does not say {text!r}"


def test_design_layer_ratios_are_the_h100_layer_file():
    recs = records(ROOT / "results" / "layer_bench" / "gpu" / "layers-iht-h100.json")
    order = ("q/o", "gate/up", "down")
    by = {r["test"].split("llama3-8b-")[1].rstrip("]"): r["ratio_to_peers"] for r in recs}
    assert set(by) == set(order), f"layers-iht-h100.json: shapes {sorted(by)}"
    listing = {peer: listed([f"{by[s][peer]:.2f}×" for s in order])
               for peer in ("nn.Linear-bf16", "torchao-float8-tensorwise")}
    text = (f"{listing['nn.Linear-bf16']} `nn.Linear` bf16 at the Llama-3 8B q/o, gate/up and down shapes, "
            f"and {listing['torchao-float8-tensorwise']} torchao float8 tensorwise")
    assert text in prose(DESIGN), f"DESIGN §6 does not say {text!r}"


TORCH_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def kernel_ms_per_step(path: Path) -> dict[str, float]:
    """A torch.profiler table of training steps (experiments/pretrain.py --profile): kernel name ->
    its self CUDA milliseconds a step, from the table sorted by self CUDA time."""
    text = path.read_text()
    steps = int(re.match(r"(\d+) training steps", text)[1])
    table = text.split("== sorted by self_cuda_time_total")[1].split("\n==")[0]
    out = {}
    for line in table.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        m = re.fullmatch(r"([\d.]+)(us|ms|s)", cells[6]) if len(cells) >= 11 else None
        if m:
            out[cells[0]] = float(m[1]) * TORCH_UNITS[m[2]] / steps
    return out


def gemm_ms(profile: dict[str, float]) -> float:
    """A step's milliseconds in cuBLAS's GEMM kernels (``nvjet_*``) of a :func:`kernel_ms_per_step` table."""
    return sum(ms for name, ms in profile.items() if name.startswith("nvjet"))


def test_design_3b_step_breakdown_is_the_profiles_and_the_throughput_file():
    gpu = ROOT / "results" / "throughput" / "gpu"
    ada, bf16 = (kernel_ms_per_step(gpu / "profiles" / f"profile_3b_cudagraphs_{r}_h100.txt") for r in ("adahop", "bf16"))
    gemm = [gemm_ms(p) for p in (ada, bf16)]
    quant, redo, reencode = (ada[k] for k in ("_hadamard_quantize_kernel", "_redo_kernel", "_fp8_group_kernel"))
    # The profiles are of the run whose file a later run of the same stage moved to history/.
    step = {r["recipe"]: r["step_time_s"] * 1e3
            for r in records(gpu / "history" / "3b_cudagraphs_h100-2026-12-06.json")}
    without = step["adahop"] - quant - redo - reencode
    text = (f"adahop's GEMMs {gemm[0]:.1f} ms against bf16's {gemm[1]:.1f} ms, its quantize kernel {quant:.1f} ms, the "
            f"redo of rare blocks {redo:.1f} ms and the FP8 re-encode {reencode:.1f} ms. With those three at zero the timed "
            f"step, {step['adahop']:.1f} ms against bf16's {step['bf16']:.1f} ms, would be {without:.1f} ms, "
            f"{step['bf16'] / without:.2f}× bf16")
    assert text in prose(DESIGN), f"DESIGN §6 does not say {text!r}"


def test_design_allocator_figures_are_the_throughput_files():
    gpu = ROOT / "results" / "throughput" / "gpu"

    def pools(name: str) -> dict[str, tuple[dict, dict, dict]]:
        """recipe -> (record, its default pool, its graphs' pool) at the timed steps' start"""
        out = {}
        for r in records(gpu / name):
            by = {p["pool"]: p for p in r["allocator_at_start"]["pools"]}
            out[r["recipe"]] = (r, by.pop("(0, 0)"), next(iter(by.values())))
        return out

    b3, b1 = pools("history/3b_cudagraphs_h100-2026-12-06.json"), pools("1b_cudagraphs_h100.json")
    (ada, ada_main, ada_graphs), (bf, bf_main, bf_graphs) = b3["adahop"], b3["bf16"]
    fixed = ada["memory_at_start"]["allocated_gib"]
    assert abs(fixed - bf["memory_at_start"]["allocated_gib"]) < 0.01  # weights and moments: the same in both
    without = ada["peak_mem_gib"] - ada_main["inactive_gib"]
    left = 0.8 * bf["peak_mem_gib"] - fixed * 4 / 3
    texts = [
        f"adahop's graphs' pool held {ada_graphs['reserved_gib']:.2f} GiB against bf16's {bf_graphs['reserved_gib']:.2f}",
        f"its default pool held {ada_main['reserved_gib']:.2f} GiB, {ada_main['inactive_gib']:.2f} of them free fragments "
        f"(the largest {ada_main['largest_inactive_gib']:.2f} GiB), where bf16's held {bf_main['reserved_gib']:.2f} GiB "
        f"with {bf_main['inactive_gib']:.2f} free",
        f"at 1b, {b1['adahop'][1]['inactive_gib']:.2f} against {b1['bf16'][1]['inactive_gib']:.2f} GiB free",
        f"would be about {without:.2f} GiB, {without / bf['peak_mem_gib']:.2f}× bf16's",
        f"weights and AdamW's moments take {fixed:.2f} GiB",
        f"0.8× of bf16's {bf['peak_mem_gib']:.2f} GiB leaves about {left:.1f} GiB for everything else against bf16's "
        f"{bf['peak_mem_gib'] - fixed * 4 / 3:.1f}",
    ]
    for text in texts:
        assert text in prose(DESIGN), f"DESIGN §6 does not say {text!r}"

    # The same run after allocate_optimizer_state: no fragments left in the default pool.
    (ada, ada_main, ada_graphs), (bf, bf_main, bf_graphs) = (pools("3b_cudagraphs_h100.json")[r] for r in ("adahop", "bf16"))
    calibration = ada["config"]["recipe_overrides"]["calibration_steps"]
    texts = [
        f"adahop's default pool held {ada_main['reserved_gib']:.2f} GiB with {ada_main['inactive_gib']:.2f} free, as "
        f"bf16's did, beside a graphs' pool of {ada_graphs['reserved_gib']:.2f} GiB against bf16's {bf_graphs['reserved_gib']:.2f}",
        f"the peak fell to {ada['peak_mem_gib']:.1f} against {bf['peak_mem_gib']:.1f} GiB, "
        f"{ada['peak_mem_gib'] / bf['peak_mem_gib']:.2f}× bf16",
        f"ran {ada['tokens_per_s']:,.0f} against {bf['tokens_per_s']:,.0f} tokens/s "
        f"({ada['tokens_per_s'] / bf['tokens_per_s']:.2f}×)",
        f"Its untimed steps took {ada['untimed_s']:.0f} s against bf16's {bf['untimed_s']:.0f}, the compilation after "
        f"calibration {ada['untimed_step_s'][calibration]:.0f} s of them",
        f"{ada['compile_cache_files']['triton']} Triton files when adahop began",
    ]
    assert bf_main["inactive_gib"] < 0.005
    for text in texts:
        assert text in prose(DESIGN), f"DESIGN §6 does not say {text!r}"


def test_design_layer_profile_figures_are_the_profile_files():
    """DESIGN §6's account of where the IHT layer's time goes quotes results/layer_bench/gpu/profiles/."""
    folder = ROOT / "results" / "layer_bench" / "gpu" / "profiles"

    def layers(name: str) -> dict[str, dict[str, dict]]:
        out: dict[str, dict[str, dict]] = {}
        for r in records(folder / f"{name}.json"):
            out.setdefault(r["layer"], {})[r["kind"]] = r
        return out

    p = {name: layers(name) for name in ("llama3-8b-q-o", "llama3-8b-k-v", "llama3-8b-gate-up", "llama3-8b-down",
                                         "125m-q-o", "125m-gate-up", "125m-down")}

    def us(name, layer="uniform-iht", kind="gemm", field="us_per_step"):
        return p[name][layer][kind][field]

    def fmt(values):
        return listed([f"{v:.0f}" for v in values])

    def ratio(name, peer):  # the peer's device time over the layer's: its speed relative to the peer
        return us(name, peer, field="layer_us_per_step") / us(name, field="layer_us_per_step")

    big, host_bound = ("llama3-8b-gate-up", "llama3-8b-down"), ("llama3-8b-q-o", "llama3-8b-k-v")
    calls = [o["us_per_step"] / o["calls_per_step"] for name in p for o in p[name]["uniform-iht"]["host"]["ops"]
             if o["name"] == "adahop::quantize"]
    small = [ratio(n, "nn.Linear-bf16") for n in p if n.startswith("125m")]
    vs_torchao = listed([f"{ratio(n, 'torchao-float8-tensorwise'):.2f}×" for n in big])
    torchao = [us(n, "torchao-float8-tensorwise", field="layer_us_per_step") for n in big]
    gemm_share = listed([f"{us(n) / t:.2f}×" for n, t in zip(big, torchao)])
    vs_bf16 = listed([f"{ratio(n, 'nn.Linear-bf16'):.2f}×" for n in host_bound])
    text = prose(DESIGN)
    for want in (
        f"(wall {fmt(us(n, field='wall_us_per_step') for n in big)} µs a pass, device "
        f"{fmt(us(n, field='layer_us_per_step') for n in big)} µs)",
        f"on device time it runs at {vs_torchao} torchao tensorwise's speed",
        f"its three GEMMs alone ({fmt(us(n) for n in big)} µs) take {gemm_share} of torchao's whole layer "
        f"({fmt(torchao)} µs of device time)",
        f"the quantize passes ({fmt(us(n, kind='quantize') for n in big)} µs)",
        f"wall {fmt(us(n, field='wall_us_per_step') for n in host_bound)} µs against "
        f"{fmt(us(n, field='layer_us_per_step') for n in host_bound)} µs of device time, on which alone it would run at "
        f"{vs_bf16} bf16's speed",
        f"one `adahop::quantize` call costs {min(calls):.0f}–{max(calls):.0f} µs of host time",
        f"(wall {us('125m-q-o', field='wall_us_per_step'):.0f} against {us('125m-q-o', field='layer_us_per_step'):.0f} "
        f"µs of device time at q/o)",
        f"where it runs at {min(small):.2f}–{max(small):.2f}× bf16's speed",
        f"({us('125m-q-o'):.0f} against bf16's {us('125m-q-o', 'nn.Linear-bf16'):.0f} µs at q/o)",
    ):
        assert want in text, f"DESIGN §6 does not say {want!r}"
    second = {r["test"].split("llama3-8b-")[1].rstrip("]"): r["ratio_to_peers"]["nn.Linear-bf16"]
              for r in records(ROOT / "results" / "layer_bench" / "gpu" / "layers-hot.json")
              if r["op"].endswith("[iht]") and "llama3-8b-" in r["test"]}
    shapes = listed([f"{second[s]:.2f}×" for s in ("q/o", "gate/up", "down")])
    want = f"gave {shapes} bf16 there"
    assert want in text, f"DESIGN §6 does not say {want!r}"


def test_design_host_cost_figures_are_the_host_cost_files():
    """DESIGN §6's account of the layer's host time quotes results/layer_bench/gpu/host/."""
    folder = ROOT / "results" / "layer_bench" / "gpu" / "host"
    old, new = ({r["name"]: r["us_per_call"] for r in records(folder / f"host-cost-{name}.json")}
                for name in ("custom-op", "triton-op"))
    allocs = [old[k] for k in ("alloc-empty0", "alloc-empty", "alloc-zeros")]
    text = prose(DESIGN)
    for want in (
        f"the compiled layer's forward + backward took {old['layer-compiled']:.0f} µs of host time and one "
        f"`adahop::quantize` call {old['op-quantize']:.0f} µs, of which the operator's dispatch "
        f"{old['op-quantize'] - old['kernels-quantize']:.0f} µs (the kernels' host function called directly: "
        f"{old['kernels-quantize']:.0f} µs), the autotuned kernel's launch {old['launch-tuned']:.0f} µs and the redo "
        f"kernel's {old['launch-redo']:.0f} µs; the allocations {min(allocs):.0f}–{max(allocs):.0f} µs each",
        f"same direct call in {new['kernels-quantize']:.0f} µs), the compiled step took {new['layer-compiled']:.0f} µs: "
        f"{new['layer-compiled'] / new['kernels-quantize']:.1f} direct calls' worth of host time against "
        f"{old['layer-compiled'] / old['kernels-quantize']:.1f}",
        f"(a `quantize` call {new['op-quantize'] / new['kernels-quantize']:.2f} direct calls against "
        f"{old['op-quantize'] / old['kernels-quantize']:.2f})",
    ):
        assert want in text, f"DESIGN §6 does not say {want!r}"


def test_design_inductor_launches_figures_are_the_same_machine_files():
    """DESIGN §6's account of the launches against the operators, one H100: host cost and layer."""
    gpu = ROOT / "results" / "layer_bench" / "gpu"
    on, off = ({r["name"]: r["us_per_call"] for r in records(gpu / "host" / f"host-cost-{name}-h100.json")}
               for name in ("launches", "operators"))
    layers = {name: {r["shape"][2] if r["shape"][0] == 16384 else "125m": r["ratio_to_peers"]
                     for r in records(gpu / f"layers-iht-{name}-h100.json")}
              for name in ("launches", "operators")}
    lon, loff = layers["launches"], layers["operators"]
    bf16 = "nn.Linear-bf16"
    text = prose(DESIGN)
    for want in (
        f"compiled step took {on['layer-compiled']:.0f} µs of host time against {off['layer-compiled']:.0f} µs through",
        f"through its operator {off['op-fp8_mm']:.0f} µs against {off['scaled_mm']:.0f} µs for `_scaled_mm` alone",
        f"{lon[4096][bf16]:.2f}× against {loff[4096][bf16]:.2f}× `nn.Linear` bf16 at the Llama-3 8B q/o shape, "
        f"{lon[1024][bf16]:.2f}× against {loff[1024][bf16]:.2f}× at k/v and {lon['125m'][bf16]:.2f}× against "
        f"{loff['125m'][bf16]:.2f}× at the 125m model's attention",
        "against torchao float8 tensorwise, " + ", ".join(
            f"{lon[k]['torchao-float8-tensorwise']:.2f}×" for k in (4096, 1024)) +
        f" and {lon['125m']['torchao-float8-tensorwise']:.2f}× with the launches",
    ):
        assert want in text, f"DESIGN §6 does not say {want!r}"


def test_design_launched_profile_figures_are_the_slower_host_files():
    """DESIGN §6's account of the launched path's profiles, host cost and layer figures on the H100
    with the slower host, against the operators' profiles and the faster host's layer file."""
    gpu = ROOT / "results" / "layer_bench" / "gpu"

    def layers(path: Path) -> dict[str, dict[str, dict]]:
        out: dict[str, dict[str, dict]] = {}
        for r in records(path):
            out.setdefault(r["layer"], {})[r["kind"]] = r
        return out

    names = ("llama3-8b-k-v", "125m-q-o")
    launched = {n: layers(gpu / "profiles" / "launched" / f"{n}.json") for n in names}
    operators = {n: layers(gpu / "profiles" / f"{n}.json") for n in names}

    def kernels(profile: dict, layer: str = "uniform-iht") -> dict[str, float]:
        return {k["name"]: k["us_per_step"] for kind in profile[layer].values() for k in kind.get("kernels", [])}

    def fmt(values) -> str:
        return " and ".join(f"{v:.0f}" for v in values)

    iht = {n: launched[n]["uniform-iht"]["gemm"] for n in names}
    bf16 = {n: launched[n]["nn.Linear-bf16"]["gemm"] for n in names}
    passes = {n: sum(v for k, v in kernels(launched[n]).items()
                     if k in ("_hadamard_quantize_kernel", "_redo_kernel", "_fp8_reencode_kernel", "_fp8_group_kernel"))
              for n in names}
    host = {r["name"]: r["us_per_call"] for r in records(gpu / "host" / "host-cost-peers-h100-slower-host.json")}
    fast = {r["name"]: r["us_per_call"] for r in records(gpu / "host" / "host-cost-launches-h100.json")}

    def ratios(path: Path) -> list[str]:
        by = {r["out_features"] if r["tokens"] == 16384 else "125m": r["speedup_vs_bf16"]
              for r in records(path)}
        return [f"{by[k]:.2f}×" for k in (4096, 1024, "125m")]

    slow, faster = ratios(gpu / "layers-iht-launches-h100-slower-host.json"), ratios(gpu / "layers-iht-launches-h100.json")
    text = prose(DESIGN)
    for want in (
        f"one `_scaled_mm` launch took {host['scaled_mm']:.1f} µs of host time there against {fast['scaled_mm']:.1f} µs",
        f"the compiled bf16 `nn.Linear` {host['peer-bf16-compiled']:.0f} µs a forward + backward",
        f"At k/v the IHT layer took {iht[names[0]]['wall_us_per_step']:.0f} µs a pass against "
        f"{iht[names[0]]['layer_us_per_step']:.0f} µs of device time, and at the 125m model's q/o "
        f"{iht[names[1]]['wall_us_per_step']:.0f} against {iht[names[1]]['layer_us_per_step']:.0f}",
        f"its quantize kernels took {fmt(launched[n]['uniform-iht']['quantize']['us_per_step'] for n in names)} µs a pass, "
        f"against {fmt(operators[n]['uniform-iht']['quantize']['us_per_step'] for n in names)} through the operators",
        "on device time alone these two layers run at " + " and ".join(
            f"{bf16[n]['layer_us_per_step'] / iht[n]['layer_us_per_step']:.2f}×" for n in names) + " bf16's speed",
        f"the quantize and re-encode passes ({fmt(passes[n] for n in names)} µs) take " + " and ".join(
            f"{passes[n] / iht[n]['us_per_step']:.2f}×" for n in names) +
        f" the time of the three FP8 GEMMs ({fmt(iht[n]['us_per_step'] for n in names)} µs)",
        f"ran at {slow[0]}, {slow[1]} and {slow[2]} bf16 at q/o, k/v and the 125m attention shape",
        f"against {faster[0]}, {faster[1]} and {faster[2]} on the faster host",
        f"(`_fp8_reencode_kernel`, {kernels(launched[names[1]])['_fp8_reencode_kernel']:.0f} µs of the {passes[names[1]]:.0f})",
    ):
        assert want in text, f"DESIGN §6 does not say {want!r}"


def test_design_launched_path_profile_figures_are_the_profile_and_throughput_files():
    """DESIGN §6's account of where the launched path loses at 1b quotes its A/B files and profiles."""
    gpu = ROOT / "results" / "throughput" / "gpu"
    launched = json.loads((gpu / "ab" / "1b_cudagraphs_launches_caps_h100.json").read_text())
    operators = json.loads((gpu / "ab" / "1b_cudagraphs_operators_h100.json").read_text())
    assert launched["provenance"]["backend_env"] == {"ADAHOP_INDUCTOR_LAUNCHES": "1"}
    assert "ADAHOP_INDUCTOR_LAUNCHES" not in (operators["provenance"].get("backend_env") or {})
    bf16, ada = launched["records"]
    (op,) = operators["records"]
    text = (f"adahop ran {ada['tokens_per_s']:,.0f} against bf16's {bf16['tokens_per_s']:,.0f} tokens/s "
            f"({ada['tokens_per_s'] / bf16['tokens_per_s']:.2f}×) again")
    assert text in prose(DESIGN), f"DESIGN §6 does not say {text!r}"
    text = f"{op['tokens_per_s']:,.0f} ({op['tokens_per_s'] / bf16['tokens_per_s']:.2f}×;"
    assert text in prose(DESIGN), f"DESIGN §6 does not say {text!r}"

    def groups(name):
        p = kernel_ms_per_step(gpu / "profiles" / f"profile_1b_cudagraphs_{name}_h100.txt")
        inductor = {k: ms for k, ms in p.items() if k.startswith("triton_")}
        return (gemm_ms(p), p.get("_hadamard_quantize_kernel", 0.0),
                sum(inductor.values()), sum(ms for k, ms in inductor.items() if "silu" in k))

    (lg, lq, li, ls), (og, oq, oi, os_), (_, _, bi, bs) = (
        groups(n) for n in ("adahop_launches", "adahop_operators", "bf16_launches"))
    text = (f"A step's GEMMs took {lg:.1f} ms against {og:.1f} ms through the operators, its quantize kernel "
            f"{lq:.1f} ms against {oq:.1f} ms, but Inductor's own kernels {li:.1f} ms against {oi:.1f} ms "
            f"(bf16's {bi:.1f} ms). Those that fuse the SwiGLU's SiLU alone took {ls:.1f} ms against {os_:.1f} ms "
            f"(bf16's {bs:.1f} ms)")
    assert text in prose(DESIGN), f"DESIGN §6 does not say {text!r}"


# The layer benchmark's shapes as the prose lists them: Llama-3 8B's four, then the 125m model's three.
BIG_LAYERS = ["llama3-8b-q/o", "llama3-8b-k/v", "llama3-8b-gate/up", "llama3-8b-down"]
SMALL_LAYERS = ["ours-125m-attn-64k", "ours-125m-gate/up-64k", "ours-125m-down-64k"]


def layer_records(name: str) -> dict[tuple[str, str], dict]:
    """A layer-benchmark file's records by (variant, shape name): test ids are
    ``test_layer_fwd_bwd[<variant>-<shape name>]``."""
    return {(r["variant"], r["test"].split("[", 1)[1][len(r["variant"]) + 1:-1]): r
            for r in records(ROOT / "results" / "layer_bench" / "gpu" / name)}


def test_design_weight_cache_figures_are_the_layer_and_throughput_files():
    gpu = ROOT / "results" / "throughput" / "gpu"
    text = prose(DESIGN)
    layers = layer_records("layers-iht-cached-w-h100.json")

    def ratios(variant: str, shapes: list[str]) -> str:
        return listed([f"{layers[(variant, s)]['speedup_vs_bf16']:.2f}×" for s in shapes])

    big, small = BIG_LAYERS, SMALL_LAYERS
    assert (f"W ran forward + backward at {ratios('iht-cached-w', big)} `nn.Linear` bf16 at the Llama-3 8B q/o, k/v, "
            f"gate/up and down shapes, against {ratios('iht', big)} for `iht`; at the 125m model's three shapes "
            f"{ratios('iht-cached-w', small)} against {ratios('iht', small)}.") in text

    def recipes(path: Path) -> dict[str, dict]:
        return {r["recipe"]: r for r in records(path) if r.get("tokens_per_s")}

    stale = {size: recipes(gpu / "ab" / f"{size}_cudagraphs_stale-weight-cache_h100.json") for size in ("125m", "1b", "3b")}
    others = {}
    for size in ("1b", "3b"):
        losses = [r["final_loss"] for f in sorted(gpu.glob(f"**/{size}_cudagraphs*.json")) if "stale" not in f.name
                  for name, r in recipes(f).items() if name in ("bf16", "adahop")]
        others[size] = f"{min(losses):.3f} to {max(losses):.3f}"
    assert (f"Those runs ended at losses of {stale['1b']['adahop']['final_loss']:.3f} at 1b and "
            f"{stale['3b']['adahop']['final_loss']:.3f} at 3b, against {others['1b']} and {others['3b']} for adahop's "
            f"and bf16's other runs of these sizes") in text
    bound = {s: r["adahop"]["tokens_per_s"] / r["bf16"]["tokens_per_s"] for s, r in stale.items()}
    assert f"{bound['1b']:.2f}× bf16 at 1b, {bound['3b']:.2f}× at 3b and {bound['125m']:.2f}× at 125m" in text
    accum = recipes(gpu / "ab" / "1b_compile_accum4_h100.json")
    assert all(r["config"]["grad_accum"] == 4 and r["compile_mode"] == "default" for r in accum.values())
    assert (f"adahop ran {accum['adahop']['tokens_per_s'] / accum['bf16']['tokens_per_s']:.2f}× bf16 at 1b "
            f"(`ab/1b_compile_accum4_h100.json`, GPU busy {accum['adahop']['gpu_busy']['busy_fraction']:.0%} of wall "
            f"time against {accum['bf16']['gpu_busy']['busy_fraction']:.0%})") in text
    docs = [json.loads((gpu / "ab" / f"1b_compile_accum4_{run}_h100.json").read_text()) for run in ("weight-cache", "float8")]
    cached, fp8 = ({r["recipe"]: r for r in doc["records"] if r.get("tokens_per_s")} for doc in docs)
    for run in (cached, fp8):
        assert all(r["config"]["grad_accum"] == 4 and r["compile_mode"] == "default" for r in run.values())
        assert all(r["model"] == "1b" for r in run.values())
    # The two processes ran on one machine at one commit: their bf16 runs agree to 0.1%.
    assert all(doc["provenance"]["git_commit"].startswith("c613da4") for doc in docs)
    assert abs(cached["bf16"]["tokens_per_s"] / fp8["bf16"]["tokens_per_s"] - 1) < 1e-3
    c, b = cached["adahop-cached-w"], cached["bf16"]
    assert (f"`adahop-cached-w` ran {c['tokens_per_s'] / b['tokens_per_s']:.2f}× bf16 in the same process, GPU busy "
            f"{c['gpu_busy']['busy_fraction']:.0%} of wall time, peak memory {c['peak_mem_gib']:.1f} GiB against "
            f"{b['peak_mem_gib']:.1f} GiB") in text
    f = fp8["float8-tensorwise"]
    assert (f"ran {f['tokens_per_s'] / fp8['bf16']['tokens_per_s']:.2f}×, GPU busy {f['gpu_busy']['busy_fraction']:.0%} "
            f"(`ab/1b_compile_accum4_float8_h100.json`)") in text


def test_design_replayed_layer_and_accumulation_figures_are_the_files():
    text = prose(DESIGN)
    by = layer_records("layers-iht-replayed-h100.json")
    big, small = BIG_LAYERS, SMALL_LAYERS

    def cells(variant: str, shapes: list[str], replayed: bool = True, peer: str = "nn.Linear-bf16") -> list[str]:
        return [f"{(by[(variant, s)]['replayed'] if replayed else by[(variant, s)])['ratio_to_peers'][peer]:.2f}×"
                for s in shapes]

    assert (f"`iht` replayed at {listed(cells('iht', big))} `nn.Linear` bf16 at the Llama-3 8B q/o, k/v, gate/up and "
            f"down shapes, and {listed(cells('iht', small))} at the 125m model's three shapes; launched, in the same "
            f"run, {listed(cells('iht', big + small, replayed=False))}") in text
    assert (f"With the cached W, replayed: {listed(cells('iht-cached-w', big))}, then "
            f"{listed(cells('iht-cached-w', small))}.") in text
    tw = "torchao-float8-tensorwise"

    def span(c: list[str]) -> str:
        v = sorted(float(x[:-1]) for x in c)
        return f"{v[0]:.2f}×–{v[-1]:.2f}×"

    assert (f"ran {span(cells('iht-cached-w', big, peer=tw))} at the four 8B shapes and "
            f"{span(cells('iht-cached-w', small, peer=tw))} at 125m") in text
    attn = by[("iht-cached-w", "ours-125m-attn-64k")]["replayed"]["peers"]
    assert (f"whose layer there ({attn['nn.Linear-bf16']['median_s'] * 1e6:.0f} µs replayed) is faster than torchao's "
            f"({attn[tw]['median_s'] * 1e6:.0f} µs)") in text
    tests = records(ROOT / "results" / "kernel_tests" / "gpu" / "cg-accum-weight-cache-45e8f71.json")
    accum = [r for r in tests if "grad_accumulation_under_cuda_graphs" in r["test"]]
    assert len(accum) == 2 and all(r["outcome"] == "passed" for r in accum)
    bf16 = records(ROOT / "results" / "throughput" / "gpu" / "ab" / "125m_cudagraphs_accum4_h100.json")
    rec = next(r for r in bf16 if r["recipe"] == "bf16")
    assert rec["config"]["grad_accum"] == 4 and rec["compile_mode"] == "reduce-overhead"
    assert f"micro-batches of 8 sequences a step ran {rec['tokens_per_s']:,.0f} tokens/s under CUDA graphs" in text


def test_design_weight_cache_refresh_figures_are_the_files():
    ab = ROOT / "results" / "throughput" / "gpu" / "ab"
    text = prose(DESIGN)

    def ratios(name: str) -> tuple[dict[str, float], dict[str, float]]:
        recs = {r["recipe"]: r for r in records(ab / name) if r.get("tokens_per_s")}
        assert all(r["compile_mode"] == "reduce-overhead" and r["config"]["grad_accum"] == 1 for r in recs.values())
        bf16 = recs["bf16"]["tokens_per_s"]
        return ({k: r["tokens_per_s"] / bf16 for k, r in recs.items()},
                {k: r["gpu_busy"]["busy_fraction"] for k, r in recs.items()})

    (e1, b1), (e3, b3) = ratios("1b_cudagraphs_weight-cache-eager-refresh_h100.json"), \
        ratios("3b_cudagraphs_weight-cache-eager-refresh_h100.json")
    assert (f"1b trained at {e1['adahop-cached-w']:.2f}× bf16 with the cache against {e1['adahop']:.2f}× without it, "
            f"and 3b at {e3['adahop-cached-w']:.2f}×, GPU busy {b1['adahop-cached-w']:.0%} and "
            f"{b3['adahop-cached-w']:.0%} of wall time") in text
    g, gb = ratios("1b_cudagraphs_weight-cache-graphed-refresh_h100.json")
    assert "adahop" not in g  # stopped in its untimed steps, as the text says
    assert (f"1b then ran at {g['adahop-cached-w']:.2f}× bf16 with the cache, GPU busy {gb['adahop-cached-w']:.0%}"
            in text)
