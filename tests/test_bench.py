"""The benchmark's machinery on tiny cases (no timing assertions): rows, CSV and report."""

import csv
import json
import math

import pytest
import torch

from kernelzoo.bench import pack as bench_pack, report as bench_report, throughput as bench

torch.set_num_threads(1)
CPU = torch.device("cpu")


@pytest.mark.parametrize("row", [
    {"case": "train_step", "feature_map": "dpfp-2", "n_keys": 10},
    {"case": "train_step", "feature_map": "favor-64", "n_keys": 10},
    {"case": "eval", "feature_map": "softmax", "n_keys": 10},
    {"case": "delta", "feature_map": "dpfp-1", "n_keys": 6},
    {"case": "delta_read", "feature_map": "dpfp-1", "n_keys": 6},
    {"case": "fwm", "feature_map": "dpfp-1", "n_keys": 6},
    {"case": "fwm_read", "feature_map": "dpfp-1", "n_keys": 6},
], ids=lambda r: f"{r['case']}-{r['feature_map']}")
def test_run_row_has_every_column(row):
    out = bench.run_row(row, CPU, "wall", (50.0, 10.0), threads=1, memory_=False,
                        budget_s=0.0, max_repeats=1)
    assert set(bench_report.COLUMNS) <= set(out)
    assert out["baseline_ms"] > 0 and out["kernelzoo_ms"] > 0 and out["floor_ms"] > 0
    assert out["ratio"] == pytest.approx(out["baseline_ms"] / out["kernelzoo_ms"])
    assert math.isnan(out["baseline_peak_mb"]) and math.isnan(out["kernelzoo_peak_mb"])
    assert out["d_dot"] == ("inf" if row["feature_map"] == "softmax" else bench.setup(row, "kernelzoo", CPU)[1].phi.d_dot)


@pytest.mark.skipif(not torch.set_flush_denormal(False), reason="a CPU without FTZ/DAZ")
@pytest.mark.parametrize("case, flush", [("fwm", True), ("fwm_read", True), ("delta", False),
                                         ("train_step", True), ("eval", False)])
def test_rows_flush_denormals_as_training_does_and_then_restore_them(monkeypatch, case, flush):
    seen, best_ms = [], bench.best_ms

    def spy(*args, **kwargs):
        seen.append((torch.tensor([1e-39]) * 3).item())  # 3e-39 is a denormal float32
        return best_ms(*args, **kwargs)

    monkeypatch.setattr(bench, "best_ms", spy)
    row = {"case": case, "feature_map": "dpfp-1", "n_keys": 6}
    bench.run_row(row, CPU, "wall", (50.0, 10.0), threads=1, memory_=False, budget_s=0.0,
                  max_repeats=1)
    assert seen == ([0.0] if flush else [pytest.approx(3e-39, rel=1e-3)])
    assert (torch.tensor([1e-39]) * 3).item() == pytest.approx(3e-39, rel=1e-3)  # restored


def test_csv_and_markdown(tmp_path):
    row = {"case": "train_step", "feature_map": "linear", "n_keys": 10}
    rows = [bench.run_row(row, CPU, "cpu", (50.0, 10.0), threads=1, memory_=False,
                          budget_s=0.0, max_repeats=1)]
    rows[0]["kernelzoo_peak_mb"] = bench.peak_mb_here(row, "kernelzoo", CPU)
    assert rows[0]["kernelzoo_peak_mb"] >= 0
    bench_report.write_csv(rows, tmp_path / "bench.csv")
    with open(tmp_path / "bench.csv") as f:
        reader = csv.reader(f)
        header, *body = list(reader)
    assert header == bench_report.COLUMNS
    assert len(body) == 1 and len(body[0]) == len(bench_report.COLUMNS)
    assert body[0][:4] == ["train_step", "linear", "10", "64"]
    assert body[0][7] == ""  and float(body[0][8]) >= 0  # baseline peak not measured: empty
    lines = bench_report.targets(rows, bench.eval_flop_ratio) + ["sweep line"]
    bench_report.write_markdown(rows, tmp_path / "bench.md", CPU, "cpu", (50.0, 10.0), 1.0, lines)
    text = (tmp_path / "bench.md").read_text()
    assert "| train_step | linear | 10 | 64 |" in text and "GFLOP/s" in text
    assert "denormal floats flushed to 0 as training flushes them" in text
    assert "\n- train step, every map at n_keys 10 >= 3x: " in text
    assert "\n- sweep line\n" in text



def test_markdown_is_rebuilt_from_the_csv_with_notes_quoting_its_rows(tmp_path):
    """bench.md's notes quote the rows they are written with, and `bench --rebuild` writes the
    same table, targets and notes again from bench.csv alone, keeping the machine lines."""
    nan = float("nan")
    rows = [{"case": "train_step", "feature_map": fm, "n_keys": 20, "d_dot": d, "baseline_ms": b,
             "kernelzoo_ms": k, "ratio": b / k, "baseline_peak_mb": nan, "kernelzoo_peak_mb": nan,
             "floor_ms": 0.05, "pack": 1, "compile": False, "compile_s": nan}
            for fm, d, b, k in (("softmax", "inf", 1.25, 0.5), ("favor-64", 64, 3.5, 2.5))]
    bench_report.write_csv(rows, tmp_path / "bench.csv")
    again = bench_report.read_csv(tmp_path / "bench.csv")
    assert [(r["d_dot"], r["ratio"], r["compile"]) for r in again] == [("inf", 2.5, False), (64, 1.4, False)]
    assert math.isnan(again[0]["compile_s"])
    lines = bench_report.targets(rows, bench.eval_flop_ratio) + bench_report.sweep_targets(tmp_path)
    bench_report.write_markdown(rows, tmp_path / "bench.md", CPU, "cpu", (50.0, 10.0), 1.0, lines)
    first = (tmp_path / "bench.md").read_text()
    assert "the n_keys 20 rows: 0.5-3.5 ms" in first and "ratios there are 1.4-2.5x" in first
    assert "lowest train-step ratio at n_keys 20." in first
    (tmp_path / "bench.md").write_text(first.replace("| softmax |", "| stale |"))
    bench.main(["--out", str(tmp_path), "--sweeps", str(tmp_path), "--rebuild"])
    assert (tmp_path / "bench.md").read_text() == first


def test_sweep_targets_read_each_sweep_json(tmp_path):
    (tmp_path / "figure2").mkdir()
    (tmp_path / "figure2" / "sweep.json").write_text(json.dumps({"wall_seconds": 7743.0, "invocations": [
        {"points": 80, "wall_seconds": 882.0, "outcomes": {"skipped": 0, "plateau": 80}},
        {"points": 240, "wall_seconds": 6861.0, "outcomes": {"skipped": 80, "plateau": 160},
         "machine": "a CPU"}]}))
    quick, figure2 = bench_report.sweep_targets(tmp_path)
    assert quick == f"`quick` sweep in at most 45 s: no sweep recorded in {tmp_path / 'quick'}"
    assert figure2 == ("`figure2` sweep in at most 75 min: NOT met (129 min for 240 trained points "
                       "over 2 invocations on a CPU)")
    (tmp_path / "quick").mkdir()
    (tmp_path / "quick" / "sweep.json").write_text(json.dumps({"wall_seconds": 41.8, "invocations": [
        {"points": 32, "wall_seconds": 41.8}]}))
    assert bench_report.sweep_targets(tmp_path)[0] == ("`quick` sweep in at most 45 s: met (42 s "
                                                       "for 32 trained points over 1 invocation "
                                                       "on an unrecorded machine)")


def test_case_lists():
    full, quick = bench.cases(), bench.cases(quick=True)
    assert {"case": "train_step", "feature_map": "dpfp-3", "n_keys": 600} in quick
    assert any(r["case"] == "eval" for r in quick)
    assert len(full) == len(bench.MAPS) * 7 + 4 + len(bench_pack.cases())  # + delta and fwm rows
    assert {r["case"] for r in full if r["n_keys"] == 200 and r["feature_map"] == "dpfp-1"} == {
        "train_step", "delta", "delta_read", "fwm", "fwm_read"}
    packed = [r for r in full if r["case"] == "packed"]
    assert {(r["feature_map"], r["n_keys"]) for r in packed} == {
        (fm, s) for fm in ("linear", "dpfp-2") for s in (20, 100, 300, 600)}
    assert {(r["pack"], r["compile"]) for r in packed} == {
        (1, False), (2, False), (1, True), (8, False), (8, True), (32, False), (32, True)}
    assert {(r["n_keys"], r["pack"]) for r in packed if not r["compile"] and r["pack"] < 8} == {
        (100, 2), (300, 1), (600, 1)}  # auto's own choice where it is not 8
    assert {r["feature_map"] for r in full} == set(bench.MAPS)


# ------------------------------------------- the fast paths the benchmark measures, checked
# against their plain definitions (float64: to rounding; the model-level equivalence with the
# reference is tests/test_model.py's)

from kernelzoo.maps import catalog  # noqa: E402
from kernelzoo.maps import base as fm  # noqa: E402
from kernelzoo.core.rules import delta  # noqa: E402
from kernelzoo.core.rules.base import recurrent_state  # noqa: E402
from kernelzoo.maps import random_features  # noqa: E402


def _value_and_grads(fn, *inputs):
    inputs = [x.detach().clone().requires_grad_() for x in inputs]
    out = fn(*inputs)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype)
    return [out] + list(torch.autograd.grad((out * weights).sum(), inputs))


def _explicit_scores(phi, normalise, eps=1e-6, key_eps=0.0):
    def scores(k, q):
        fk, fq = phi(k), phi(q, is_query=True)
        if normalise:
            fk = fk / (fk.sum(-1, keepdim=True) + key_eps)
            fq = fq / (fq.sum(-1, keepdim=True) + eps)
        return fq @ fk.transpose(-1, -2)
    return scores


@pytest.mark.parametrize("queries", [1, 3])
@pytest.mark.parametrize("normalise", [False, True])
@pytest.mark.parametrize("name,params", [
    ("dpfp", {"nu": 1}), ("dpfp", {"nu": 3}),
    ("favor", {"m": 5, "variant": "hyperbolic"}), ("favor", {"m": 6, "variant": "positive"}),
    ("favor", {"m": 5, "variant": "hyperbolic", "stabilize": True, "input_scale": "performer"}),
    ("elu", {}), ("softmax", {}),
], ids=str)
def test_scores_equal_explicit_features(name, params, normalise, queries):
    extra = {"redraw": "never", "seed": 0} if name == "favor" else {}
    phi = catalog.build_feature_map(name, d_key=4, **params, **extra).double()
    g = torch.Generator().manual_seed(1)
    k = 2 * torch.randn(3, 7, 4, generator=g, dtype=torch.float64)
    q = 2 * torch.randn(3, queries, 4, generator=g, dtype=torch.float64)
    kw = dict(normalise=normalise, eps=1e-6, key_eps=1e-3)
    fast = _value_and_grads(lambda k, q: phi.scores(k, q, **kw), k, q)
    plain = _value_and_grads(_explicit_scores(phi, normalise, 1e-6, 1e-3), k, q)
    assert fast[0].shape == (3, queries, 7)
    for a, b in zip(fast, plain):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_dpfp_scores_keep_the_zero_key_nan():
    phi = catalog.build_feature_map("dpfp", d_key=4, nu=2).double()
    k, q = torch.randn(2, 5, 4, dtype=torch.float64), torch.randn(2, 1, 4, dtype=torch.float64)
    k[0, 2] = 0.0  # sum phi(k) = 0: 0/0 with key_eps = 0, as the explicit features
    s = phi.scores(k, q, normalise=True, key_eps=0.0)
    assert s[0, 0, 2].isnan() and s[0, 0, [0, 1, 3, 4]].isfinite().all() and s[1].isfinite().all()


def test_favor_scores_use_the_projection_of_their_forward():
    phi = catalog.build_feature_map("favor", d_key=4, m=3, variant="hyperbolic", seed=0).double()
    k = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    q = torch.randn(2, 1, 4, dtype=torch.float64)
    omega = phi.projection
    s = phi.scores(k, q)
    phi.maybe_redraw()  # a new projection before the backward
    assert not torch.equal(omega, phi.projection)
    (grad,) = torch.autograd.grad(s.sum(), k)
    phi.projection = omega
    (expected,) = torch.autograd.grad(_explicit_scores(phi, False)(k, q).sum(), k)
    torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)


def test_exp_where_float32_underflows():
    x = torch.linspace(-300.0, 20.0, 200_001)
    exact = x.double().exp()
    fast = random_features._exp(x)
    assert torch.equal(fast == 0, exact.float() == 0)  # underflows exactly where float32 does
    normal = exact > torch.finfo(torch.float32).tiny
    rel = ((fast.double() - exact).abs() / exact)[normal]
    assert rel.max() < 3 * torch.finfo(torch.float32).eps  # within 2-3 ulp of exp
    sub = ~normal & (exact.float() > 0)  # subnormal results: within a few steps of 2^-149
    assert ((fast.double() - exact).abs()[sub] <= 4 * 2.0**-149).all()
    y = torch.tensor([-200.0, -95.0, -50.0, 1.0], requires_grad=True)
    out = random_features._exp(y)
    out.sum().backward()
    torch.testing.assert_close(y.grad, out.detach())  # exp' = exp
    same = torch.tensor([-3.0, 0.5, 2.0])  # nothing underflows: torch.exp itself
    assert torch.equal(random_features._exp(same), same.exp())


@pytest.mark.slow
def test_exp_compiles_whole_and_agrees_with_eager():
    """Under trainer.compile the underflow test would break FAVOR+'s graph (a bool of a
    tensor); fullgraph=True fails on any break. Values and gradients as eager's, within 3 ulp."""
    x = torch.cat([torch.linspace(-300.0, 20.0, 1001), torch.linspace(-3.0, 3.0, 101)])
    compiled = torch.compile(random_features._exp, fullgraph=True)
    for y in (x, x[-101:]):  # with and without underflowing entries
        y = y.clone().requires_grad_()
        out = compiled(y)
        (grad,) = torch.autograd.grad(out.sum(), y)
        eager, ulps = random_features._exp(y.detach()), dict(rtol=3 * 2.0**-23, atol=4 * 2.0**-149)
        torch.testing.assert_close(out.detach(), eager, **ulps)
        torch.testing.assert_close(grad, eager, **ulps)  # exp' = exp


def test_elu_plus_one_and_its_derivative():
    x = torch.cat([torch.linspace(-30, 30, 1001, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)])
    fast = _value_and_grads(fm.Elu(1).fn, x)
    plain = _value_and_grads(lambda x: torch.nn.functional.elu(x) + 1, x)
    for a, b in zip(fast, plain):
        torch.testing.assert_close(a, b, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("m,n", [(1, 6), (6, 1), (4, 5), (1, 1)])
def test_batched_dot_equals_bmm(m, n):
    g = torch.Generator().manual_seed(2)
    a, b = (torch.randn(3, r, 4, generator=g, dtype=torch.float64) for r in (m, n))
    fast = _value_and_grads(fm.batched_dot, a, b)
    plain = _value_and_grads(lambda a, b: a @ b.transpose(-1, -2), a, b)
    for x, y in zip(fast, plain):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("L,queries", [(40, 1), (25, 6)])
def test_delta_direct_read_equals_the_loop(L, queries):
    g = torch.Generator().manual_seed(3)
    k = torch.nn.functional.softplus(torch.randn(2, L, 6, generator=g, dtype=torch.float64))
    q = torch.nn.functional.softplus(torch.randn(2, queries, 6, generator=g, dtype=torch.float64))
    v = torch.randn(2, L, 5, generator=g, dtype=torch.float64)
    beta = torch.sigmoid(torch.randn(2, L, generator=g, dtype=torch.float64))
    k, q = k / k.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    fast = _value_and_grads(delta.read_direct, k, v, q, beta)
    loop = _value_and_grads(lambda k, v, q, b: q @ recurrent_state(delta.RULE, k, v, b, None).transpose(1, 2),
                            k, v, q, beta)
    for a, b in zip(fast, loop):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_favor_scores_in_float32_where_features_underflow():
    phi = catalog.build_feature_map("favor", d_key=8, m=16, variant="hyperbolic", redraw="never", seed=0)
    g = torch.Generator().manual_seed(4)
    k, q = 4 * torch.randn(2, 50, 8, generator=g), 4 * torch.randn(2, 1, 8, generator=g)
    assert (phi._logits(k, False) < -87).float().mean() > 0.1  # the slow regime
    fast = _value_and_grads(phi.scores, k, q)
    plain = _value_and_grads(_explicit_scores(phi, False), k, q)  # float32 too: same underflows
    for a, b in zip(fast, plain):
        scale = b.abs().max().item()
        assert scale > 0
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * scale)


def test_packed_rows_time_the_pack_against_one_run_alone():
    """A packed row is per run-step: K runs' step / K against one run's eager step."""
    row = {"case": "packed", "feature_map": "linear", "n_keys": 20, "pack": 4, "compile": False}
    out = bench_pack.run_row(row, torch.device("cpu"), "cpu", bench.best_ms, 0.05)
    assert out["d_dot"] == 64 and math.isnan(out["compile_s"])
    assert out["ratio"] == pytest.approx(out["baseline_ms"] / out["kernelzoo_ms"])
    assert 0 < out["kernelzoo_ms"] < 50 and 0 < out["baseline_ms"] < 50
    lines = bench_pack.targets([{**out, "pack": 8}])
    assert lines[0].startswith("packed engine as auto chooses (pack 8, eager) at n_keys 20 >= 3x: ")


def test_packed_targets_summarise_compilation_per_feature_map():
    """The compiled rows' gains and first-step costs are read from the rows, per feature map."""
    def row(fm, s, pack, ratio, compile_s):
        return {"case": "packed", "feature_map": fm, "n_keys": s, "pack": pack,
                "compile": not math.isnan(compile_s), "ratio": ratio, "compile_s": compile_s}
    rows = [row("linear", 20, 8, 2.5, math.nan), row("linear", 20, 1, 1.5, 4.0),
            row("linear", 600, 1, 1.6, 5.0), row("linear", 600, 32, 0.8, 2.0),
            row("dpfp-2", 20, 1, 1.9, 6.0), row("dpfp-2", 600, 32, 0.4, 382.0)]
    lines = bench_pack.targets(rows)
    assert lines[-2] == ("one run compiled (pack 1) against eager, n_keys 20-600: "
                         "dpfp-2 1.9-1.9x, linear 1.5-1.6x")
    assert lines[-1] == ("compilation (torch.compile, first step of a new shape): dpfp-2 6-382 s, "
                         "linear 2-5 s per shape; dpfp-2 6-6 s, linear 4-5 s for one run")


@pytest.mark.slow  # spawns a pool per way: ~15 s
def test_the_scaleout_bench_writes_its_table(tmp_path, monkeypatch):
    from kernelzoo.bench import scaleout

    monkeypatch.setattr(scaleout, "QUICK_ROWS", [{"feature_map": "linear", "n_keys": 8}])
    monkeypatch.setattr(scaleout, "REPEATS", 1)
    monkeypatch.setattr(scaleout, "SECONDS", 0.6)
    scaleout.run(True, tmp_path)
    rows = list(csv.DictReader((tmp_path / "scaleout_quick.csv").open()))
    assert [r["feature_map"] for r in rows] == ["linear"] and list(rows[0]) == list(scaleout.COLUMNS)
    r = {k: float(v) for k, v in rows[0].items() if k != "feature_map"}
    assert min(r["one"], r["threads"], r["workers"]) > 0
    assert r["workers_over_threads"] == pytest.approx(r["workers"] / r["threads"], rel=1e-3)
    assert r["efficiency"] == pytest.approx(r["workers"] / (r["cores"] * r["one"]), rel=1e-3)
    md = (tmp_path / "scaleout_quick.md").read_text()
    assert "| linear | 8 |" in md and "One worker per core is the faster use" in md
