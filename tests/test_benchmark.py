"""`scripts/benchmark.py --quick --family all` end to end in a subprocess (without --write, so docs/ is untouched):
it exits 0 and its table has one row per family and measurement, with finite positive numbers and a ratio.
Speed itself is not asserted here (SPEC section 9: the benchmark reports it; timed unit tests do not)."""

import errno
import functools
import importlib.util
import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from forked_python import run_python

from hf_scratch_transformer.cli import benchmark_report
from hf_scratch_transformer.cli.paired_ratios import median_interval, verdict
from hf_scratch_transformer.scratch_attention_kernel import EAGER_MAX_KEYS

ROOT = Path(__file__).resolve().parent.parent
TRAINING = [f"train {dtype}{suffix}" for dtype in ("fp32", "bf16") for suffix in ("", " achieved", " MFU")]
MEMORY = [f"peak memory {workload}" for workload in ("train fp32", "train bf16", "prefill")]
MEMORY += ["activation memory train fp32", "activation memory train fp32 checkpointed"]
PREFILL = ["prefill", "prefill padded"]
DECODING = ["decode batch 1", "decode batch 8", "decode batch 8 padded"]
INT8 = ["decode batch 1 int8 weight-only"] if importlib.util.find_spec("torchao") else []  # else a message, no row
EXPECTED = {
    "gpt2": {*PREFILL, *DECODING, *TRAINING, *MEMORY},
    "bert": {*PREFILL, *TRAINING, *MEMORY},  # an encoder does not generate
    "marian": {*PREFILL, *DECODING, *TRAINING, *MEMORY},
    "llama": {"decode batch 1", *INT8},  # fp32 and int8 weight-only decoding
}


# MKL, oneDNN and ATen limited to AVX2: the instruction set of an AVX2-only host, where bf16 is not native, on any CPU.
AVX2_ONLY = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


# On an AVX2-only host its own run is that one: limited again, it would run the same benchmark twice (70 s there).
AVX2_HOST = torch.backends.cpu.get_cpu_capability() == "AVX2"
ISAS = {"this CPU's": {}} if AVX2_HOST else {"this CPU's": {}, "AVX2 only": AVX2_ONLY}


@pytest.fixture(scope="module")
def quick_runs() -> dict[str, subprocess.CompletedProcess]:
    """One quick run per instruction set, the two at once (about 25 s each on a 2-core AVX2 host, most of it starting
    processes: the run and its two memory workers; this CPU's run is forked from the suite's server, the limited one a
    fresh interpreter): speed is not asserted, so sharing the cores changes nothing checked here."""
    with ThreadPoolExecutor(len(ISAS)) as runs:
        running = {isa: runs.submit(run_benchmark, "--quick", "--family", "all", env=limits, timeout=600)
                   for isa, limits in ISAS.items()}
        return {isa: run.result() for isa, run in running.items()}


@pytest.mark.slow
@pytest.mark.parametrize("isa", list(ISAS))
def test_quick_benchmark_prints_a_complete_table(quick_runs, isa):
    result = quick_runs[isa]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "wrote" not in result.stdout

    if isa == "AVX2 only":  # named as limited: its record is not the AVX2 host's
        own = torch.backends.cpu.get_cpu_capability()
        assert (f"CPU capability AVX2 (ATEN_CPU_CAPABILITY; the CPU has {own}; MKL_ENABLE_INSTRUCTIONS=AVX2, "
                "ONEDNN_MAX_CPU_ISA=AVX2); bf16 not native") in result.stdout
    elif AVX2_HOST:
        assert "CPU capability AVX2;" in result.stdout
    # The header names the machine-dependent choices; the bf16 ones are timed only where bf16 is native.
    attention = result.stdout.split("bf16 training attention ", 1)[1].split(f", over more than {EAGER_MAX_KEYS}")[0]
    products = result.stdout.split("bf16 products of many rows ", 1)[1].split(" (kernel_choice")[0]
    if "bf16 not native" in result.stdout:
        assert attention == products == "-"
    else:
        # --quick trains over 32 tokens: the choice timed for up to 128 keys
        assert re.fullmatch(r"(eager|sdpa) \(1-128 keys\) \(HF_SCRATCH_CPU_ATTENTION=\w+\)", attention), attention
        # --quick's bf16 products are of up to 64 rows: none takes the many-row choice
        assert re.fullmatch(r"none run \(HF_SCRATCH_CPU_BF16_PRODUCTS=(auto|native|fp32)\)", products), products
    # Nor do its prefill and training (decoding steps' kernels, by their rows), nor anything compiled.
    assert "prefill none run, training none run; compiled one-row products none run" in result.stdout
    assert table_rows(result.stdout) == expected_rows(result.stdout)
    assert "`generate()`: both sides generated the same tokens in every decoding row." in result.stdout
    eager = r"[\d.]+x eager \([\d.]+-[\d.]+\)"
    assert re.search(rf"^Batch-1 `generate\(\)` against the native model's eager decoding \(target 1.5x\): gpt2 ours "
                     rf"{eager}; marian ours {eager}; llama ours {eager}\. At or above the target: .+\.$",
                     result.stdout, re.MULTILINE), result.stdout[-2000:]
    bf16_line = re.search(r"^bf16 training against the native model \(target 1.1x where bf16 is native\): gpt2 "
                          r"[\d.]+x, bert [\d.]+x, marian [\d.]+x\. Below the target: .+\.$", result.stdout,
                          re.MULTILINE)
    assert bool(bf16_line) == ("bf16 not native" not in result.stdout), result.stdout[-2000:]


def expected_rows(stdout: str) -> dict[str, set]:
    """EXPECTED, less the bf16 training rows where the run found bf16 not native (an AVX2-only host: bf16 would be
    emulated there)."""
    if "bf16 not native" in stdout:
        return {family: {m for m in rows if "bf16" not in m} for family, rows in EXPECTED.items()}
    return EXPECTED


def table_rows(stdout: str) -> dict[str, set]:
    """The measurements of the printed table per family, each row checked: finite positive numbers, the ratio of
    them, for the timed rows a range of paired ratios and their median with an interval inside it, no row twice; and
    the line under the table sorts every throughput row once by its interval."""
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header == ["family", "measurement", "unit", "better", "native", "ours", "ours/native", "paired",
                      "paired median (95% interval)"]
    found: dict[str, set] = {family: set() for family in EXPECTED}
    throughput = {}  # tok/s row -> its printed interval
    for line in lines[2:]:
        family, measurement, unit, better, *numbers, paired, interval = (
            cell.strip() for cell in line.strip("|").split("|"))
        assert better in ("higher", "lower") and unit, line
        native, ours, ratio = map(float, numbers)
        if measurement.startswith(("prefill", "decode", "train")):  # timed rows: paired ratios
            low, high = map(float, paired.split("-"))
            median, median_low, median_high = map(float, re.fullmatch(r"([\d.]+) \(([\d.]+)-([\d.]+)\)",
                                                                      interval).groups())
            rounding = 0.005  # the range and the interval are printed to 2 decimals, the median to 3
            assert 0 < low <= high and low - rounding <= median_low <= median_high <= high + rounding, line
            assert median_low - rounding <= median <= median_high + rounding, line
            if unit == "tok/s":
                throughput[f"{family} {measurement}"] = median_low, median_high
        else:
            assert paired == interval == "-", line
        assert all(math.isfinite(x) and x > 0 for x in (native, ours, ratio)), line
        assert ratio == pytest.approx(ours / native, rel=0.05, abs=2e-3), line  # printed values are rounded
        assert measurement not in found[family], f"duplicate row: {line}"
        found[family].add(measurement)
    check_verdicts(stdout, throughput)
    return found


def check_verdicts(stdout: str, intervals: dict[str, tuple[float, float]]) -> None:
    """The line under the table counts every throughput row once, naming the tied and slower ones, each where its
    printed interval (rounded to 2 decimals) lies against 1.0."""
    summary = re.search(r"by their 95% interval: faster in (\d+); tied in (\d+)(?: \((.*?)\))?; slower in (\d+)"
                        r"(?: \((.*?)\))?\.$", stdout, re.MULTILINE)
    assert summary, stdout[-2000:]
    faster, tied_count, tied, slower_count, slower = summary.groups()
    tied, slower = (names.split(", ") if names else [] for names in (tied, slower))
    assert (len(tied), len(slower)) == (int(tied_count), int(slower_count))
    assert int(faster) + len(tied) + len(slower) == len(intervals) and not set(tied) & set(slower)
    for name, (low, high) in intervals.items():
        if name in slower:
            assert high <= 1.0, name
        elif name in tied:
            assert low <= 1.0 <= high, name
        else:
            assert low >= 1.0, name


def run_benchmark(*options: str, timeout: int, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_python([sys.executable, ROOT / "scripts" / "benchmark.py", *options], cwd=ROOT,
                      env=os.environ | {"HF_HUB_OFFLINE": "1"} | (env or {}), timeout=timeout)


@pytest.mark.slow
def test_compiled_adds_a_row_of_batch_1_decoding_compiled_over_a_static_cache():
    result = run_benchmark("--quick", "--family", "gpt2", "--compiled", timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert table_rows(result.stdout)["gpt2"] == expected_rows(result.stdout)["gpt2"] | {"decode batch 1 compiled"}
    assert re.search(r"compiled one-row products (a row dot|F\.linear) \(", result.stdout), result.stdout[-2000:]
    decimals, interval = r"[\d.]+", r"\([\d.]+-[\d.]+\)"
    assert re.search(rf": gpt2 ours {decimals}x eager {interval}, {decimals}x compiled \({decimals}-{decimals}; native "
                     rf"compiled {decimals}x {interval}\)\. At or above", result.stdout), result.stdout[-2000:]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_quick_benchmark_on_the_gpu_prints_a_complete_table():
    """--device cuda: both sides on the GPU, every row but the int8 one (CPU decoding), bf16 rows where the GPU has
    bf16; the header names the GPU instead of CPU kernel choices."""
    result = run_benchmark("--quick", "--family", "all", "--device", "cuda", timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"GPU {torch.cuda.get_device_name()}, CUDA {torch.version.cuda}" in result.stdout
    assert "fp32 kernel chosen" not in result.stdout and "no int8 decode rows" in result.stdout
    bf16 = torch.cuda.is_bf16_supported()
    expected = {family: {m for m in rows if "int8" not in m and (bf16 or "bf16" not in m)}
                for family, rows in EXPECTED.items()}
    assert table_rows(result.stdout) == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_device_cuda_without_a_gpu_is_refused_before_measuring(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        import_benchmark(monkeypatch, "--device", "cuda", "--write")
    assert stopped.value.code == 2 and "--device cuda needs a CUDA GPU" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("options, message", [
    (["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
    (["--seq", "0"], "argument --seq: must be >= 1, got 0"),
    (["--warmup", "0"], "argument --warmup: must be >= 1, got 0"),
    (["--vocab", "3"], "argument --vocab: must be >= 6, got 3"),
    (["--heads", "5"], "--hidden 64 must split into --heads 5 heads of an even size"),
])
def test_sizes_a_run_cannot_take_are_refused_before_measuring(monkeypatch, capsys, options, message):
    """Each ended in a traceback (a median of no repetition, a reshape of 0 elements, ids drawn from an empty range,
    heads that do not divide the width), some after timing had started; a negative warm-up was taken, and none
    timed ours' first run with the process's kernel choices (--quick's first prefill pair: 0.02)."""
    with pytest.raises(SystemExit) as stopped:
        import_benchmark(monkeypatch, "--quick", "--family", "gpt2", *options)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def import_benchmark(monkeypatch, *options: str):
    """The benchmark module imported in this process with these options (it parses sys.argv when imported)."""
    monkeypatch.setattr(sys, "argv", ["hf-scratch benchmark", *options])
    monkeypatch.delitem(sys.modules, "hf_scratch_transformer.cli.benchmark", raising=False)
    return importlib.import_module("hf_scratch_transformer.cli.benchmark")


@pytest.mark.parametrize("options, named", [
    (["--layers", "2"], "--layers"), (["--seq", "32", "--batch", "8", "--new-tokens", "8"], "--seq, --new-tokens")])
def test_write_refuses_a_record_of_other_sizes(monkeypatch, capsys, options, named):
    """--quick's sizes given one by one, or any model or input size of one's own, made a table that replaced the
    class's full record (the targets' figures are at the default sizes); the default sizes given, more repetitions or
    another seed still make one."""
    unforced(monkeypatch)
    with pytest.raises(SystemExit) as stopped:
        import_benchmark(monkeypatch, "--write", *options)
    message = "--write records a full run of every family at the default sizes (docs/benchmarks keeps one per machine "
    assert stopped.value.code == 2 and f"{message}class): leave out {named}\n" in capsys.readouterr().err
    benchmark = import_benchmark(monkeypatch, "--write", "--layers", "6", "--seq", "256", "--repeats", "11", "--seed=1")
    assert benchmark.args.write and benchmark.args.repeats == 11


def unforced(monkeypatch) -> None:
    """No kernel forced and no library held to fewer instructions in this test (the suite can run under
    MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2): --write refuses a run under them."""
    for variable in ("HF_SCRATCH_CPU_KERNELS", "HF_SCRATCH_CPU_BF16_PRODUCTS", "HF_SCRATCH_CPU_ATTENTION",
                     "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA"):
        monkeypatch.delenv(variable, raising=False)


@pytest.mark.parametrize("variable, value", [("HF_SCRATCH_CPU_KERNELS", "onednn"),
                                             ("HF_SCRATCH_CPU_BF16_PRODUCTS", "fp32"),
                                             ("HF_SCRATCH_CPU_ATTENTION", "eager"),
                                             ("MKL_ENABLE_INSTRUCTIONS", "AVX2"), ("ONEDNN_MAX_CPU_ISA", "AVX2")])
def test_write_refuses_a_run_under_forced_kernels_or_limited_libraries(monkeypatch, capsys, variable, value):
    """A run with a kernel forced (named in the header) or with MKL or oneDNN held to fewer instructions (the class
    still read as the CPU's own) wrote over the class's record; unset, or "auto", still makes one."""
    unforced(monkeypatch)
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as stopped:
        import_benchmark(monkeypatch, "--write")
    assert stopped.value.code == 2 and capsys.readouterr().err.endswith(f"class): unset {variable}\n")
    monkeypatch.setenv(variable, "auto")
    assert import_benchmark(monkeypatch, "--write").args.write


def test_the_median_interval_holds_the_median_and_narrows_with_more_pairs():
    """A bootstrap interval of the median: around it, the same for the same samples, zero-wide for equal ones,
    narrower for more pairs drawn alike; no pairs is an error, not an interval."""
    import random

    draw = random.Random(1)
    few, many = ([draw.gauss(1.1, 0.1) for _ in range(count)] for count in (7, 70))
    for ratios in (few, many):
        low, high = median_interval(ratios)
        assert low <= statistics.median(ratios) <= high and median_interval(ratios) == (low, high)
    assert median_interval([1.2] * 5) == (1.2, 1.2)
    assert median_interval(many)[1] - median_interval(many)[0] < median_interval(few)[1] - median_interval(few)[0]
    with pytest.raises(ValueError, match="at least one paired ratio"):
        median_interval([])


@pytest.mark.parametrize(("zeros", "inside"), [(5, True), (4, False)])
def test_the_interval_ends_at_the_tails_of_the_resampled_medians(zeros, inside):
    """The 95% interval holds the medians of resamples but for 2.5% at either end. Of 17 pairs, 0 against 1: the
    median of a resample is 0 when 9 or more of its 17 draws are, with probability 3.6% (5 zeros) or 1.2% (4): inside
    the interval, then outside (a 90% interval, or the mean of resamples, or resamples a pair short, moved its ends).
    Many draws make the interval's ends sharp; the reversed ratios check the upper end alike."""
    probability = sum(math.comb(17, k) * (zeros / 17) ** k * (1 - zeros / 17) ** (17 - k) for k in range(9, 18))
    assert (0.025 < probability < 0.05) if inside else probability < 0.025
    ratios = [0.0] * zeros + [1.0] * (17 - zeros)
    assert median_interval(ratios, draws=20000) == ((0.0 if inside else 1.0), 1.0)
    assert median_interval([1.0 - ratio for ratio in ratios], draws=20000) == (0.0, (1.0 if inside else 0.0))


@pytest.mark.parametrize(("interval", "expected"), [((1.01, 1.3), "faster"), ((0.7, 0.99), "slower"),
                                                    ((0.9, 1.1), "tied"), ((1.0, 1.2), "tied"), ((0.8, 1.0), "tied")])
def test_a_row_is_faster_or_slower_only_where_its_interval_excludes_one(interval, expected):
    assert verdict(interval) == expected


def test_the_verdict_line_names_the_tied_and_slower_throughput_rows(benchmark_module):
    """Only tok/s rows count (GFLOP/s and MFU repeat the training samples; memory rows have none)."""
    def timed(measurement, native, ours, unit="tok/s"):
        return benchmark_module.row("gpt2", measurement, unit, "higher", 1.0, 1.0, {"native": native, "ours": ours})

    results = [timed("prefill", [2.0, 2.1, 1.9], [1.0, 1.0, 1.0]),  # 2x faster in every pair
               timed("train fp32", [1.0, 1.1, 0.9], [1.0, 1.0, 1.0]),  # around 1
               timed("train fp32 MFU", [1.0, 1.1, 0.9], [1.0, 1.0, 1.0], unit="% of mm"),
               timed("decode batch 1", [1.0, 1.0, 1.0], [2.0, 2.0, 2.0]),  # twice the time
               benchmark_module.row("gpt2", "peak memory prefill", "MiB", "lower", 100.0, 50.0)]
    assert benchmark_report.verdicts(results) == (
        "Throughput rows against the native model, by their 95% interval: faster in 1; tied in 1 (gpt2 train "
        "fp32); slower in 1 (gpt2 decode batch 1).")


def untimed_rates(benchmark_module):
    """rates(family, measurement, native, ours): a row of tok/s, without samples, as the target lines read them."""
    def rates(family: str, measurement: str, native: float, ours: float) -> dict:
        return benchmark_module.row(family, measurement, "tok/s", "higher", native, ours)

    return rates


def decoding(benchmark_module, family: str, measurement: str, native: list, ours: list, reference: list | None = None
             ) -> dict:
    """A decoding row of one token per call from its seconds per repetition; `reference`: the native model's eager
    decoding timed alongside, as the compiled row has it."""
    samples = {"native": native, "ours": ours}
    result = benchmark_module.row(family, measurement, "tok/s", "higher", 1 / statistics.median(native),
                                  1 / statistics.median(ours), samples)
    if reference:
        with_reference = samples | {benchmark_module.TARGET_REFERENCE: reference}
        result["reference"] = benchmark_module.against_reference(with_reference, 1)
    return result


def test_the_batch_1_line_sets_every_decoding_against_the_native_eager_one_timed_beside_it(benchmark_module):
    """Compiled rates divide by the reference timed in the compiled row (not the eager row's, timed at another
    moment), each ratio with its paired interval; only ours can reach the target, and where none of ours does the
    fastest of either model is named; the int8 row and other families' rows stay out."""
    seconds = [1.0, 1.0, 1.0]
    results = [decoding(benchmark_module, "gpt2", "decode batch 1", seconds, [0.8, 0.8, 0.9]),
               decoding(benchmark_module, "gpt2", "decode batch 1 compiled", [0.5] * 3, [0.6] * 3, [0.8, 0.8, 0.9]),
               decoding(benchmark_module, "gpt2", "decode batch 8", seconds, [0.3] * 3),
               decoding(benchmark_module, "llama", "decode batch 1", seconds, [1.25] * 3),
               decoding(benchmark_module, "llama", "decode batch 1 int8 weight-only", seconds, [0.1] * 3)]
    assert benchmark_report.batch_1_target(results) == (
        "Batch-1 `generate()` against the native model's eager decoding (target 1.5x): gpt2 ours 1.25x eager "
        "(1.11-1.25), 1.33x compiled (1.33-1.50; native compiled 1.60x (1.60-1.80)); llama ours 0.80x eager "
        "(0.80-0.80). At or above the target: none (the fastest measured here: gpt2 native compiled 1.60x).")
    results[1] = decoding(benchmark_module, "gpt2", "decode batch 1 compiled", [0.5] * 3, [0.4] * 3, [0.8] * 3)
    assert benchmark_report.batch_1_target(results).endswith("At or above the target: gpt2 ours compiled 2.00x.")
    results[1] = decoding(benchmark_module, "gpt2", "decode batch 1 compiled", [0.5] * 3, [0.4] * 3, [0.6] * 3)
    assert benchmark_report.batch_1_target(results).endswith("At or above the target: gpt2 ours compiled 1.50x.")
    assert benchmark_report.batch_1_target([untimed_rates(benchmark_module)("bert", "prefill", 1.0, 2.0)]) == ""


def test_the_batch_1_line_gives_the_paired_median_not_the_ratio_of_the_medians(benchmark_module):
    """Drift within a run can set the ratio of the two medians outside the paired ratios' interval: the line's
    figures, and whether the target is reached, are the paired medians, as the table's last column."""
    drifting = [1.0, 2.0, 4.0]  # medians: the native model's 2.0, ours 1.0 (ratio 2.0); paired 1.0, 0.5, 4.0
    results = [decoding(benchmark_module, "gpt2", "decode batch 1", drifting, [1.0, 4.0, 1.0]),
               decoding(benchmark_module, "gpt2", "decode batch 1 compiled", [2.0] * 3, [1.0, 4.0, 1.0], drifting)]
    assert results[0]["ratio"] == 2.0
    assert benchmark_report.batch_1_target(results) == (
        "Batch-1 `generate()` against the native model's eager decoding (target 1.5x): gpt2 ours 1.00x eager "
        "(0.50-4.00), 1.00x compiled (0.50-4.00; native compiled 1.00x (0.50-2.00)). At or above the target: none "
        "(the fastest measured here: gpt2 ours eager 1.00x).")


def test_the_bf16_line_names_the_families_below_the_target(benchmark_module):
    rates = untimed_rates(benchmark_module)
    results = [rates("gpt2", "train bf16", 100.0, 120.0), rates("gpt2", "train fp32", 100.0, 90.0),
               rates("marian", "train bf16", 100.0, 105.0)]
    assert benchmark_report.bf16_training_target(results) == (
        "bf16 training against the native model (target 1.1x where bf16 is native): gpt2 1.20x, marian 1.05x. Below "
        "the target: marian.")
    assert benchmark_report.bf16_training_target(results[:2]).endswith("gpt2 1.20x. Below the target: none.")
    assert benchmark_report.bf16_training_target(results[1:2]) == ""  # no bf16 rows: bf16 not native
    at_target = [rates("gpt2", "train bf16", 100.0, 110.0)]
    assert benchmark_report.bf16_training_target(at_target).endswith("gpt2 1.10x. Below the target: none.")


def test_the_same_tokens_line_names_the_decoding_rows_whose_sides_generated_other_tokens():
    """Whether both sides generated the same tokens was kept in the JSON alone: a decoding row's tok/s ratio over other
    tokens (an early end on one side) would compare other work without a word in the table."""
    details = {"gpt2": {"same_generate_output_batch1": True, "same_generate_output_batch8": False, "int8": "x"},
               "marian": {"same_generate_output_batch1_compiled": True}}
    assert benchmark_report.same_tokens(details) == (
        "`generate()`: the sides generated other tokens in gpt2 batch8 (their tok/s compare other work).")
    details["gpt2"]["same_generate_output_batch8"] = True
    assert benchmark_report.same_tokens(details) == (
        "`generate()`: both sides generated the same tokens in every decoding row.")
    assert benchmark_report.same_tokens({"bert": {"train_flops_per_step": 1}}) == ""


def test_machine_class_names_the_gpu_or_the_cpu_line_and_capability():
    cpu = {"cpu": "Intel(R) Xeon(R) Processor @ 2.10GHz", "cpu_capability": "AVX512", "gpu": None}
    assert benchmark_report.machine_class(cpu) == "intel-xeon-avx512"
    assert benchmark_report.machine_class(cpu | {"cpu": "AMD EPYC 9R14", "cpu_capability": "AVX2"}) == "amd-epyc-avx2"
    assert benchmark_report.machine_class(cpu | {"gpu": "NVIDIA H100 80GB HBM3"}) == "nvidia-h100-80gb-hbm3"
    # An AVX-512 CPU held to AVX2 (the tests' AVX2-only runs) wrote over the AVX2 host's record.
    libraries = {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    limited = cpu | {"cpu": "AMD EPYC 9R14", "cpu_capability": "AVX2", "cpu_capability_limited_from": "AVX512",
                     "cpu_library_limits": libraries}
    assert benchmark_report.machine_class(limited) == "amd-epyc-avx512-limited-to-avx2"
    assert (ROOT / "docs" / "benchmarks" / "amd-epyc-avx512-limited-to-avx2.md").exists()  # the hand-made records'
    # ATen's limit alone (MKL and oneDNN on AVX-512: the limited run --write takes) filed under that name too.
    aten_alone, with_mkl = ({"cpu_library_limits": limits} for limits in ({}, {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}))
    assert benchmark_report.machine_class(limited | aten_alone) == "amd-epyc-avx512-aten-limited-to-avx2"
    assert benchmark_report.machine_class(limited | with_mkl) == "amd-epyc-avx512-aten-mkl-limited-to-avx2"


def test_a_capability_held_below_the_cpus_own_is_named(monkeypatch):
    """ATEN_CPU_CAPABILITY=avx2 on an AVX-512 CPU: ATen reads AVX2, the CPU's flags say AVX512; without the variable,
    or on an AVX2 CPU, there is no limit to name."""
    avx512 = {"avx2", "fma", "avx512f", "avx512vl", "avx512bw", "avx512dq"}
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    assert benchmark_report.capability_limited_from(avx512) is None
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert benchmark_report.capability_limited_from(avx512) == "AVX512"
    assert benchmark_report.capability_limited_from({"avx2", "fma", "avx512f"}) is None  # no AVX512 for ATen
    assert benchmark_report.capability_limited_from(avx512 - {"avx512dq"}) is None  # ATen needs all four


def test_the_header_names_the_instruction_sets_mkl_and_onednn_are_held_to():
    """MKL_ENABLE_INSTRUCTIONS and ONEDNN_MAX_CPU_ISA went unsaid: set alone they leave ATen's capability, and the
    class, the CPU's own. Records from before them have no such key."""
    avx512 = {"cpu_capability": "AVX512"}
    assert benchmark_report.capability_with_limits(avx512) == "AVX512"
    mkl = {"cpu_library_limits": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}}
    assert benchmark_report.capability_with_limits(avx512 | mkl) == "AVX512 (MKL_ENABLE_INSTRUCTIONS=AVX2)"
    all_three = {"cpu_capability": "AVX2", "cpu_capability_limited_from": "AVX512",
                 "cpu_library_limits": {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}
    assert benchmark_report.capability_with_limits(all_three) == (
        "AVX2 (ATEN_CPU_CAPABILITY; the CPU has AVX512; MKL_ENABLE_INSTRUCTIONS=AVX2, ONEDNN_MAX_CPU_ISA=AVX2)")


@pytest.mark.parametrize("kernel", ["native", "onednn"])
def test_training_flops_credit_each_side_with_its_own_products(benchmark_module, monkeypatch, force_choice, kernel):
    """BERT's GFLOP/s and MFU rows gave ours the native model's count, though its MLM head projects only the masked
    positions (`sparse_prediction`); and oneDNN's products (ScratchLinear's kernel where it wins) were not counted
    at all. Each side now has its own count, the head's work on the unmasked positions (dense and decoder, forward
    and both gradients) the difference, and the rows' paired ratios are of FLOP/s."""
    from hf_scratch_transformer import kernel_choice
    from hf_scratch_transformer.linear_kernels import ONEDNN_AVAILABLE

    if kernel == "onednn" and not ONEDNN_AVAILABLE:
        pytest.skip("no oneDNN in this torch")
    force_choice(kernel_choice.KERNELS_VARIABLE, kernel_choice.clear_kernel_choices, kernel)
    seconds = {"native": 1.0, "ours": 1.0, "samples": {"native": [1.0, 2.0], "ours": [1.0, 2.0]}}
    monkeypatch.setattr(benchmark_module, "interleaved", lambda *args, **kwargs: seconds)  # nothing timed
    rows, extra = benchmark_module.bench_family("bert", {"fp32": 1e9, "bf16": 1e9})
    flops, a = extra["train_flops_per_step"], benchmark_module.args
    labels = benchmark_module.make_inputs("bert", a.batch, a.seq, labels=True)["labels"]
    unmasked = int((labels == -100).sum())
    assert flops["native"] - flops["ours"] == 6 * unmasked * (a.hidden * a.hidden + a.hidden * a.vocab)
    achieved = next(r for r in rows if r["measurement"] == "train fp32 achieved")
    assert (achieved["native"], achieved["ours"]) == (flops["native"] / 1e9, flops["ours"] / 1e9)
    assert achieved["paired_ratios"] == pytest.approx([flops["ours"] / flops["native"]] * 2)


def test_compiled_decoding_is_what_transformers_does_on_the_device(benchmark_module, monkeypatch):
    """On a CPU the step compiles only under a CompileConfig that allows every device (ours: inductor's default mode,
    with its C++ wrapper); on a GPU transformers compiles by itself, with its own CompileConfig (CUDA graphs), as a
    user gets it."""
    cpu = benchmark_module.compiled_decoding()
    assert cpu["cache_implementation"] == "static"
    assert cpu["compile_config"]._compile_all_devices and cpu["compile_config"].options == {"cpp_wrapper": True}
    monkeypatch.setattr(benchmark_module.args, "device", "cuda")
    assert benchmark_module.compiled_decoding() == {"cache_implementation": "static"}


@pytest.mark.parametrize("options", [["--quick"], ["--family", "gpt2"]], ids=["quick", "one-family"])
def test_write_refuses_to_replace_a_full_record_with_a_partial_run(options, tmp_path, monkeypatch, capsys):
    """docs/benchmarks keeps one full run per machine class: `--write` with a smoke test or one family would replace
    it (in the folder it runs in), so it stops before measuring anything."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        import_benchmark(monkeypatch, *options, "--write")
    assert stopped.value.code == 2 and "--write records a full run of every family" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_write_refuses_a_folder_it_cannot_write_its_record_in_before_measuring_anything(tmp_path, monkeypatch,
                                                                                         capsys):
    """--write found a docs/benchmarks it could not write in (an installed package's folder, a read-only checkout)
    only after the whole run, half an hour: now before the first measurement, in one line."""
    (tmp_path / "docs").write_text("a file where the record's folder would be\n")
    unforced(monkeypatch)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        import_benchmark(monkeypatch, "--write")
    said = capsys.readouterr()
    assert stopped.value.code == 2 and "The benchmark record could not be written in ." in said.err
    assert "leave --write out" in said.err and said.out == ""


def test_write_leaves_no_folder_of_its_own_before_the_record(tmp_path, monkeypatch):
    """--write tries the record's folder before the run by making it: a run stopped before its record (a Ctrl-C, a
    failure) left an empty docs/benchmarks behind; the folders it made to try are gone again, the user's are kept."""
    unforced(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert import_benchmark(monkeypatch, "--write").args.write
    assert not any(tmp_path.iterdir())
    (tmp_path / "docs").mkdir()
    import_benchmark(monkeypatch, "--write")
    assert [path.name for path in tmp_path.rglob("*")] == ["docs"]


RECORDED_MACHINE = {"gpu": None, "cpu": "AMD EPYC 7B13 64-Core Processor", "cpu_capability": "AVX512"}
WRITE_A_RECORD = """import json, sys
sys.argv = ["hf-scratch benchmark"]
from hf_scratch_transformer.cli import benchmark
benchmark.or_stop(benchmark.write_record, json.loads(sys.argv_record), "| new table |\\n" * 2000)
"""


def test_a_record_that_cannot_be_written_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
    """--write wrote docs/benchmarks/<class>.md, then .json, in place: a full disk (here a file size limit) left the
    table cut short and the earlier figures beside it, and ended in a traceback after the whole run; a kill between
    them, the new table beside the earlier JSON."""
    record = tmp_path / "docs/benchmarks/amd-epyc-avx512"
    record.parent.mkdir(parents=True)
    record.with_suffix(".md").write_text("| earlier table |\n")
    record.with_suffix(".json").write_text('{"earlier": true}\n')
    report = {"machine": RECORDED_MACHINE, "results": []}
    script = tmp_path / "write_a_record.py"
    script.write_text(WRITE_A_RECORD.replace("sys.argv_record", repr(json.dumps(report))))
    result = run_python([sys.executable, str(script)], cwd=tmp_path, timeout=120, limit_file_size=4000)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "The benchmark record could not be written in docs/benchmarks" in result.stderr
    assert record.with_suffix(".md").read_text() == "| earlier table |\n"
    assert record.with_suffix(".json").read_text() == '{"earlier": true}\n'
    assert sorted(path.name for path in record.parent.iterdir()) == ["amd-epyc-avx512.json", "amd-epyc-avx512.md"]
    monkeypatch.chdir(tmp_path)
    benchmark_report.write_record(report, "| new table |\n")
    assert record.with_suffix(".md").read_text() == "| new table |\n"
    assert json.loads(record.with_suffix(".json").read_text()) == report
    assert sorted(path.name for path in record.parent.iterdir()) == ["amd-epyc-avx512.json", "amd-epyc-avx512.md"]


@pytest.mark.parametrize("failing", [".md", ".json"])
def test_a_record_that_cannot_take_its_place_is_an_error_saying_what_is_there(tmp_path, monkeypatch, failing):
    """The record is written beside its place, then renamed, the table first: a rename that failed (a file system gone
    read-only) ended in a traceback; at the second, it left the new table beside the earlier figures without a word."""
    record = tmp_path / "docs/benchmarks/amd-epyc-avx512"
    record.parent.mkdir(parents=True)
    record.with_suffix(".md").write_text("| earlier table |\n")
    record.with_suffix(".json").write_text('{"earlier": true}\n')
    report = {"machine": RECORDED_MACHINE, "results": []}
    replace = os.replace

    def read_only(source, target, *args, **kwargs):
        if Path(target).suffix == failing:
            raise OSError(errno.EROFS, "Read-only file system", str(source))
        return replace(source, target, *args, **kwargs)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "replace", read_only)
    with pytest.raises(benchmark_report.WriteError) as error:
        benchmark_report.write_record(report, "| new table |\n")
    said, (table, figures) = str(error.value), (f"docs/benchmarks/amd-epyc-avx512{end}" for end in (".md", ".json"))
    assert "(OSError: [Errno 30] Read-only file system" in said
    if failing == ".md":
        assert said.startswith("The benchmark record could not be written in docs/benchmarks")
        assert "docs/benchmarks/amd-epyc-avx512.md and .json are as they were" in said
        assert record.with_suffix(".md").read_text() == "| earlier table |\n"
        assert sorted(path.name for path in record.parent.iterdir()) == ["amd-epyc-avx512.json", "amd-epyc-avx512.md"]
    else:
        assert said.startswith("The benchmark record's figures could not take their place in docs/benchmarks")
        assert f"{table} is this run's table, beside the earlier figures in {figures}; this run's are in " \
               f"{figures}.tmp" in said
        assert record.with_suffix(".md").read_text() == "| new table |\n"
        assert json.loads(Path(f"{figures}.tmp").read_text()) == report
    assert record.with_suffix(".json").read_text() == '{"earlier": true}\n'


@pytest.fixture
def benchmark_module(monkeypatch):
    """The benchmark module imported in this process, for its helpers."""
    return import_benchmark(monkeypatch, "--quick")


def test_the_tables_paired_cells_are_the_range_and_the_median_with_its_interval(benchmark_module):
    """The paired ratios' range, then their median (not the mean, 1.260) and its interval, low to high. The header
    is the current record's."""
    record = json.loads((ROOT / "docs" / "benchmarks" / "amd-epyc-avx512.json").read_text())
    timed = benchmark_module.row("gpt2", "prefill", "tok/s", "higher", 1.0, 1.0,
                                 {"native": [1.0, 1.0, 1.0, 1.3, 2.0], "ours": [1.0] * 5})
    low, high = timed["paired_interval"]
    assert low < high
    text = benchmark_report.markdown(record | {"results": [timed], "details": {}}, method="(method)")
    assert f"| gpt2 | prefill | tok/s | higher | 1 | 1 | 1.000 | 1.00-2.00 | 1.000 ({low:.2f}-{high:.2f}) |" in text


def test_inputs_are_ids_no_special_token_takes_and_mlm_masks_15_percent(benchmark_module):
    """Ids from 3 to vocab - 3: none is GPT-2's, BERT's or Marian's pad, bos or eos (0-2, Marian's vocab - 1), so
    that no row stops early or attends less. The MLM batch puts the mask id (3) at about 15% of the positions and
    labels those only, as the masking collator does."""
    a = benchmark_module.args
    for family in ("gpt2", "bert", "marian"):
        inputs = benchmark_module.make_inputs(family, 64, 64, labels=False)
        ids = torch.cat([inputs["input_ids"], inputs.get("decoder_input_ids", inputs["input_ids"])])
        assert 3 <= int(ids.min()) and int(ids.max()) <= a.vocab - 3
    batch = benchmark_module.make_inputs("bert", 64, 64, labels=True)
    labelled = batch["labels"] != -100
    assert (batch["input_ids"][labelled] == 3).all() and 0.12 < labelled.float().mean() < 0.18
    unmasked = benchmark_module.make_inputs("bert", 64, 64, labels=False)["input_ids"]
    assert torch.equal(batch["labels"][labelled], unmasked[labelled])  # the labels are the ids masked


@pytest.mark.parametrize("family", ["bert", "marian"])
def test_rates_count_input_positions_and_mfu_is_against_its_dtypes_peak(benchmark_module, monkeypatch, force_choice,
                                                                          family):
    """tok/s counts batch x seq positions, batch x (source + target) for Marian; a bf16 row's MFU is against the
    machine's bf16 rate, not fp32's. Timings are one second a run (nothing timed)."""
    from hf_scratch_transformer import kernel_choice

    force_choice(kernel_choice.KERNELS_VARIABLE, kernel_choice.clear_kernel_choices, "native")
    seconds = {"native": 1.0, "ours": 1.0, "samples": {"native": [1.0, 1.0], "ours": [1.0, 1.0]}}
    monkeypatch.setattr(benchmark_module, "interleaved", lambda *args, **kwargs: seconds)
    monkeypatch.setattr(benchmark_module.args, "no_bf16", False)
    peaks = {"fp32": 1e9, "bf16": 4e9}
    rows, extra = benchmark_module.bench_family(family, peaks)
    a, flops = benchmark_module.args, extra["train_flops_per_step"]
    positions = a.batch * a.seq * (2 if family == "marian" else 1)
    by_name = {r["measurement"]: r for r in rows}
    for name in ("prefill", "prefill padded", "train fp32", "train bf16"):
        assert (by_name[name]["native"], by_name[name]["ours"]) == (positions, positions)
    for dtype in ("fp32", "bf16"):
        mfu = by_name[f"train {dtype} MFU"]
        assert (mfu["native"], mfu["ours"]) == pytest.approx((100 * flops["native"] / peaks[dtype],
                                                              100 * flops["ours"] / peaks[dtype]))


@pytest.mark.parametrize("family", ["gpt2", "bert", "marian"])
def test_padded_rows_take_a_batch_of_mixed_lengths_padded_where_users_pad_it(benchmark_module, family):
    """Every input of the timed rows had an all-ones mask: the padded rows time sequences that keep a quarter to all
    of their positions, evenly spread, GPT-2's prompts padded on the left, BERT's texts and Marian's sources and
    targets on the right (the targets with lengths of their own); the real ids are kept, padding takes the pad id."""
    inputs = benchmark_module.make_inputs(family, 8, 32, labels=False)
    padded = benchmark_module.with_padding(family, inputs, pad=0)  # make_inputs draws ids from 3 on
    lengths = torch.tensor([8, 11, 15, 18, 22, 25, 29, 32])[:, None]
    real = (torch.arange(32) >= 32 - lengths) if family == "gpt2" else (torch.arange(32) < lengths)
    assert torch.equal(padded["attention_mask"], real.long())
    assert torch.equal(padded["input_ids"][real], inputs["input_ids"][real]) and (padded["input_ids"][~real] == 0).all()
    assert (inputs["attention_mask"] == 1).all()  # the unpadded inputs are left as they were
    if family == "marian":
        kept = torch.arange(32) < lengths.flip(0)
        assert torch.equal(padded["decoder_input_ids"] != 0, kept)
        assert torch.equal(padded["decoder_input_ids"][kept], inputs["decoder_input_ids"][kept])
        assert "decoder_attention_mask" not in padded
    else:
        assert padded.keys() == inputs.keys()


def test_the_header_names_the_kernels_the_runs_took_and_none_they_did_not(benchmark_module, monkeypatch):
    """Prefill's and training's fp32 kernels, bf16 products' and bf16 training attention's were timed when the header
    was written where no run had such a product or sequence (--quick's are of up to 64 rows, decoding steps';
    --family llama decodes only; BERT and GPT-2 train with attention dropout) and printed as chosen; compiled
    decoding's one-row products were not named at all. Attention's choices are named by the keys each covers."""
    threads = torch.get_num_threads()
    choices = {("batch_decoding", (256, 64), threads): "transposed"}
    monkeypatch.setattr(benchmark_module, "KERNEL_CHOICES", choices)
    monkeypatch.setattr(benchmark_module, "blas_reads_rows_slowly", lambda: True)
    chosen = {}
    monkeypatch.setattr(benchmark_module, "CHOSEN", chosen)
    bf16_kernel = functools.cache(lambda: "fp32")
    monkeypatch.setattr(benchmark_module, "bf16_kernel", bf16_kernel)
    kernels = benchmark_module.kernel_choices(bf16_native=True, compiled=False)
    assert kernels["fp32 batch decoding"] == "transposed (256x64)"
    assert kernels["fp32 prefill"] == kernels["fp32 training"] == kernels["fp32 compiled decoding"] == "none run"
    assert kernels["bf16 products"].startswith("none run (HF_SCRATCH_CPU_BF16_PRODUCTS=")
    assert kernels["bf16 training attention"].startswith("none run (HF_SCRATCH_CPU_ATTENTION=")
    choices[("prefill", (1536, 384), threads)] = "onednn"
    bf16_kernel()  # a bf16 product of many rows asked
    chosen |= {256: "eager", 128: "sdpa"}  # bf16 training steps over 129-256 keys and over up to 128 asked
    kernels = benchmark_module.kernel_choices(bf16_native=True, compiled=True)
    assert (kernels["fp32 prefill"], kernels["fp32 training"]) == ("onednn", "none run")
    assert kernels["fp32 compiled decoding"] == "a row dot"
    assert kernels["bf16 products"].startswith("fp32 (HF_SCRATCH_CPU_BF16_PRODUCTS=")
    assert kernels["bf16 training attention"].startswith(
        "sdpa (1-128 keys), eager (129-256 keys) (HF_SCRATCH_CPU_ATTENTION=")


def _fails(error: Exception):
    def fail(*args, **kwargs):
        raise error

    return fail


@pytest.mark.parametrize("where", ["config", "loading"])
def test_a_torchao_that_cannot_quantize_skips_the_int8_rows(benchmark_module, monkeypatch, where):
    """An older or broken torchao fails in other ways than ImportError: TorchAoConfig raises ValueError when
    transformers finds torchao too old, quantizing can raise RuntimeError. The run goes on without the int8 rows and
    says why, as where torchao is missing, instead of dying after the other families were measured."""
    from tiny_models import tiny_lm

    if where == "config":
        monkeypatch.setattr(benchmark_module, "TorchAoConfig", _fails(ValueError("torchao is too old")))
    model = tiny_lm("decoder")
    if where == "loading":
        monkeypatch.setattr(type(model), "from_pretrained", _fails(RuntimeError("torchao is too old")))
    result = benchmark_module.load_int8({"ours": model})
    assert isinstance(result, str) and "torchao is too old" in result


def fake_memory_workers(benchmark_module, monkeypatch) -> list[tuple]:
    """`subprocess.Popen` replaced by memory workers that report a prefill peak of 1 MiB for GPT-2 and BERT; the list
    returned gets ("started", side, families, environment) and ("waited", side) as the benchmark starts and waits."""
    events = []

    class Worker:
        def __init__(self, command, env, **kwargs):
            start = command.index("--memory-worker") + 1
            self.side, families = command[start], command[start + 1:start + 3]
            self.returncode = 0
            events.append(("started", self.side, families, env))

        def communicate(self):
            events.append(("waited", self.side))
            return json.dumps({family: {"prefill": 1.0} for family in ("gpt2", "bert")}) + "\n", ""

    monkeypatch.setattr(benchmark_module.subprocess, "Popen", lambda command, **kwargs: Worker(command, **kwargs))
    return events


def test_the_memory_workers_run_at_once_with_the_kernels_this_process_chose(benchmark_module, monkeypatch):
    """One worker per side for every family, started before either is waited for, each told this process's kernel
    choices for prefill and training (timed again beside the other worker's load, a choice could differ from the
    timed rows'), bf16 products and bf16 training attention; they do not decode."""
    from hf_scratch_transformer import kernel_choice

    threads = torch.get_num_threads()
    monkeypatch.setattr(benchmark_module, "KERNEL_CHOICES", {
        (kernel_choice.PREFILL, (1536, 384), threads): "onednn",
        (kernel_choice.TRAINING, (384, 1536), threads): "native",
        (kernel_choice.DECODING, (384, 384), threads): "transposed",
    })
    bf16_kernel = functools.cache(lambda: "fp32")
    bf16_kernel()  # asked by the timed bf16 training
    monkeypatch.setattr(benchmark_module, "bf16_kernel", bf16_kernel)
    monkeypatch.setattr(benchmark_module, "CHOSEN", {256: "eager"})  # asked by Marian's timed bf16 training
    events = fake_memory_workers(benchmark_module, monkeypatch)
    memory = benchmark_module.measure_memory(["gpt2", "bert"])
    told = {kernel_choice.KERNELS_VARIABLE: "prefill=onednn,training=native",  # the workers do not decode
            benchmark_module.ATTENTION_VARIABLE: "eager", kernel_choice.BF16_PRODUCTS_VARIABLE: "fp32"}
    assert [event[:3] + ({name: event[3][name] for name in told},) for event in events[:2]] == [
        ("started", side, ["gpt2", "bert"], told) for side in ("native", "ours")]
    assert events[2:] == [("waited", "native"), ("waited", "ours")]
    assert memory == {side: {"gpt2": {"prefill": 1.0}, "bert": {"prefill": 1.0}} for side in ("native", "ours")}


def test_measuring_memory_times_no_choice_the_timed_runs_did_not_make(benchmark_module, monkeypatch, force_choice):
    """The memory workers were told bf16 training attention's kernel, asked for while starting them: where no timed
    run had made it (a run without bf16 rows, or of GPT-2 and BERT alone), it was timed there (about 50 ms) for
    workers that never ask it (their workloads are the timed runs'); so were --quick's prefill and training fp32
    kernels and bf16 products (its products of up to 64 rows are decoding steps'). Now nothing is timed, and the
    workers keep the setting they inherit ("auto") for every choice this process did not make."""
    from hf_scratch_transformer import kernel_choice, scratch_attention_kernel

    clears = {kernel_choice.KERNELS_VARIABLE: kernel_choice.clear_kernel_choices,
              kernel_choice.BF16_PRODUCTS_VARIABLE: kernel_choice.clear_kernel_choices,
              scratch_attention_kernel.ATTENTION_VARIABLE: scratch_attention_kernel.CHOSEN.clear}
    for variable, clear in clears.items():
        force_choice(variable, clear, "auto")  # none made yet in this process

    def timing(name: str):
        def timed(*args, **kwargs):
            raise AssertionError(f"measure_memory timed {name}")

        return timed

    for module, name in ((scratch_attention_kernel, "time_kernels"), (kernel_choice, "time_kernels"),
                         (kernel_choice, "time_bf16_kernels")):
        monkeypatch.setattr(module, name, timing(f"{module.__name__}.{name}"))
    events = fake_memory_workers(benchmark_module, monkeypatch)
    benchmark_module.measure_memory(["gpt2", "bert"])
    assert [{name: event[3][name] for name in clears} for event in events if event[0] == "started"] == [
        dict.fromkeys(clears, "auto")] * 2


@pytest.mark.parametrize("sides", [("native", "ours"), ("native", "ours", "native eager")], ids=["two", "three"])
def test_interleaved_sides_rotate_so_none_runs_after_itself_more_often(benchmark_module, monkeypatch, sides):
    """A side that runs right after itself finds its weights in the caches: with two sides both do so equally often
    (native, ours; ours, native; ...); with three, none does (a reversed order favoured the two outer sides). Every
    side opens and closes as many rounds as every other."""
    order = []
    monkeypatch.setattr(benchmark_module, "synchronize", lambda: None)
    benchmark_module.interleaved(order.append, warmup=0, repeats=2 * len(sides) * 3, sides=sides)
    rounds = [order[start:start + len(sides)] for start in range(0, len(order), len(sides))]
    assert all(sorted(round_) == sorted(sides) for round_ in rounds)
    after_itself = Counter(first for first, then in itertools.pairwise(order) if first == then)
    assert (len(sides) == 2) == bool(after_itself)
    assert max(after_itself.values(), default=0) - min(after_itself.values(), default=0) <= 1
    assert set(Counter(round_[0] for round_ in rounds).values()) == {len(rounds) // len(sides)}
    assert set(Counter(round_[-1] for round_ in rounds).values()) == {len(rounds) // len(sides)}


def test_bf16_is_native_by_the_test_bf16_training_makes_on_one_core(benchmark_module, monkeypatch):
    """Beside another process's products, a parallel fp32 product ran 85x slower (2.1 GFLOP/s) where an emulated,
    serial bf16 one did not (3.0): timed with all threads, bf16 looked native on an AVX2 CPU and the quick run beside
    another (tests above) grew bf16 rows. The verdict is the one `--bf16` makes, on one core, where fp32 runs at 181."""
    from hf_scratch_transformer import mixed_precision

    def rate(dtype, *args, **kwargs):
        if dtype == torch.bfloat16:
            return 3.0
        return 181.0 if torch.get_num_threads() == 1 else 2.1

    monkeypatch.setattr(mixed_precision, "matmul_gflops", rate)
    busy_peaks = {"bf16": 3.0e9, "fp32": 2.1e9}  # what the benchmark's all-thread products measured
    machine = benchmark_module.machine(busy_peaks)
    assert not machine["bf16_native"] and machine["bf16_speed"] == pytest.approx(3.0 / 181.0)
    assert "Train in fp32" in mixed_precision.slow_bf16_refusal("bf16", "cpu", force=False, option="--bf16")
