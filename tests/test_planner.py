"""Lesson 19's planner: its formulas against hand counts and the ZeRO paper, its refusals, its command line."""

import math
from dataclasses import replace

import pytest

from nnlib.lesson04_collectives.costmodel import Machine
from nnlib.lesson12_pipeline.memory import layer_params
from nnlib.lesson19_planning.layout import Layout
from nnlib.lesson19_planning.memory import unbuildable
from nnlib.lesson19_planning.planner import (H100_NODES, Cluster, Compute, Job, main, memory_bytes, plan, predict,
                                             refusal, stage_seconds, step_seconds, value_bytes)

FREE = Machine(0.0, 0.0)


def cluster(ranks=4, per_node=4, memory=2**30, compute=Compute(0.0, 1e9, 1e9), **links):
    return Cluster(ranks, memory, per_node, links.get("inside", FREE), links.get("across", FREE), compute)


@pytest.mark.parametrize("stage, paper_bytes", [(0, lambda d: 2 + 2 + 12), (1, lambda d: 2 + 2 + 12 / d),
                                                (2, lambda d: 2 + (2 + 12) / d), (3, lambda d: (2 + 2 + 12) / d)])
def test_mixed_adam_in_the_papers_accounting_follows_the_zero_papers_formulas(stage, paper_bytes):
    job = Job.large(7.5e9, 32, activation_bytes=0.0, batch=1024, optimizer="adam", precision="bfloat16", paper=True)
    parameters = sum(layer_params(job.layer_sizes))
    for data in (2, 8, 64):
        held = memory_bytes(job, Layout(data=data, zero=stage), data)
        assert sum(held.values()) == pytest.approx(paper_bytes(data) * parameters, rel=1e-12)


def test_lesson_17s_mixed_precision_keeps_a_float32_gradient_and_the_master_beside_the_weights():
    assert value_bytes("adam", "float16") == {"weights": 6, "gradients": 6, "optimizer state": 8}
    assert value_bytes("momentum", "float64") == {"weights": 8, "gradients": 8, "optimizer state": 8}
    assert value_bytes("sgd", "float32")["optimizer state"] == 0


def test_a_pipelines_compute_is_m_minus_1_slowest_stages_plus_each_stage_once():
    job = Job((100, 50, 50, 10), batch=64)  # stages: layers {0, 1} and {2} on 2 ranks
    machine = cluster(ranks=2, compute=Compute(1e-3, 1e9, 1e12))
    layout = Layout(pipeline=2, micro_batches=4, schedule="gpipe")
    rows = 64 // 4
    first = 1e-3 * 2 + rows * (6 * (100 * 50 + 50 * 50) - 2 * 100 * 50) / 1e9
    second = 1e-3 + rows * 6 * 50 * 10 / 1e9
    assert stage_seconds(job, machine, layout) == pytest.approx([first, second])
    assert step_seconds(job, machine, layout)["compute"] == pytest.approx(3 * first + first + second)


def test_the_data_axis_goes_over_the_link_its_group_spans():
    job = Job((64, 32, 32, 10), batch=64)
    slow, fast = Machine(1e-3, 1e-9), Machine(1e-6, 1e-12)
    two_nodes, one_node = (cluster(ranks=4, per_node=per_node, inside=fast, across=slow) for per_node in (2, 4))
    across = step_seconds(job, two_nodes, Layout(data=2, tensor=2))["data"]  # replicas 2 ranks apart: two nodes
    inside = step_seconds(job, one_node, Layout(data=2, tensor=2))["data"]
    assert across > 2 * 1e-3 > inside  # a ring Allreduce over 2 ranks: 2 alphas of the link it uses
    assert step_seconds(job, two_nodes, Layout(data=2, tensor=2))["tensor"] < 1e-3  # tensor pairs: neighbours


def test_refusals_say_why():
    job, machine = Job((64, 3, 32, 10), batch=8), cluster()
    assert refusal(job, machine, Layout(data=2)) is not None  # 2 of 4 ranks
    assert refusal(job, machine, Layout(tensor=4)) is not None  # wider than the 3-unit layer
    assert "micro-batches" in refusal(job, machine, Layout(data=4, micro_batches=4))  # 2 rows each
    assert "per rank, has" in refusal(job, cluster(memory=1.0), Layout(data=4))
    assert refusal(job, machine, Layout(data=4)) is None
    with pytest.raises(ValueError, match="memory per rank must be positive"):
        plan(job, cluster(memory=0))


def test_h100_nodes_keep_tensor_parallelism_inside_a_node_unless_told_otherwise():
    job = Job.large(7e10, 80, activation_bytes=1e6, batch=4096, optimizer="adam", precision="bfloat16")
    nodes = Cluster(32, **H100_NODES)
    fits, refused = plan(job, nodes)
    assert fits and all(layout.tensor <= 8 for *_, layout in fits)
    assert any(layout.tensor == 16 and "spans nodes" in reason for reason, layout in refused)
    allowed, _ = plan(job, Cluster(32, **H100_NODES, tensor_across_nodes=True))
    assert any(layout.tensor == 16 for *_, layout in allowed)
    assert [fit[0]["step"] for fit in fits] == sorted(fit[0]["step"] for fit in fits)


def test_the_command_prints_the_ranked_layouts_and_refuses_bad_input(capsys):
    assert main(["--layers", "784,128,64,10", "--ranks", "4", "--batch", "256", "--top", "3"]) == 0
    printed = capsys.readouterr().out
    assert "D x T x S" in printed and "layouts fit" in printed and len(printed.splitlines()) >= 5
    assert main(["--layers", "784,128,10", "--memory-gib", "-1"]) == 2
    assert "memory per rank must be positive" in capsys.readouterr().out


@pytest.mark.parametrize("degrees, says", [((2, 2, 1), "but there are 8 ranks"), ((1, 8, 1), "too wide"),
                                           ((1, 1, 8), "only 3 weight layers")])
def test_impossible_degrees_are_refused_with_what_is_wrong(degrees, says):
    job, machine = Job((64, 6, 32, 10), batch=64), cluster(ranks=8, per_node=8)
    with pytest.raises(ValueError, match=says):
        plan(job, machine, degrees)
    with pytest.raises(ValueError, match=says):
        predict(job, machine, Layout(*degrees))
    assert main(["--layers", "64,6,32,10", "--ranks", "8", "--grid", ",".join(map(str, degrees))]) == 2


def test_the_command_shows_every_zero_stage_of_a_grid(capsys):
    assert main(["--parameters", "7.5e9", "--depth", "32", "--activation-bytes", "1e5", "--ranks", "64", "--grid",
                 "64,1,1", "--precision", "bfloat16", "--paper", "--top", "100", "--memory-gib", "1000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert {line.split()[5] for line in lines[1:] if " x " in line[:12]} == {"0", "1", "2", "3"}


def test_pipeline_stages_are_cut_by_predicted_cost_not_by_count():
    job = Job((784, 512, 16, 16, 16, 16, 10), batch=256)  # one wide layer, five narrow ones
    machine = cluster(ranks=2, compute=Compute(1e-6, 1e9, 1e9))
    layouts = [layout for *_, layout in plan(job, machine)[0] if layout.pipeline == 2]
    assert layouts and {layout.cut for layout in layouts} == {(1, 5)}  # an even cut would be (3, 3)
    even = replace(layouts[0], cut=None)
    assert max(stage_seconds(job, machine, layouts[0])) < max(stage_seconds(job, machine, even))


def test_a_large_models_activations_shrink_with_accumulation_and_with_recomputation_per_stage():
    job = Job.large(1e9, 16, activation_bytes=1000.0, batch=64)
    activations = lambda layout: memory_bytes(job, layout, layout.data * layout.pipeline)["activations"]
    assert activations(Layout(data=2, micro_batches=4)) == pytest.approx(1000 * 64 / 2 / 4)  # one micro-batch alive
    assert activations(Layout(data=2, micro_batches=4, recompute=4)) == pytest.approx(1000 * 8 * (4 + 3) / 16)
    # 4 stages of 4 layers, 1F1B m = 8: 4 micro-batches of 8 rows alive on stage 0, a quarter of the layers;
    # every 4 layers a stage keeps 1 checkpoint and recomputes 3: all of its 4 layers' worth, no saving
    assert activations(Layout(pipeline=4, micro_batches=8)) == pytest.approx(1000 * 8 * 4 / 4)
    assert activations(Layout(pipeline=4, micro_batches=8, recompute=4)) == activations(Layout(pipeline=4,
                                                                                                micro_batches=8))


def test_a_stages_tensor_allreduces_go_through_the_pipeline_formula():
    job = Job((64, 32, 32, 32, 10), batch=64)
    slow = cluster(ranks=4, compute=Compute(0.0, 1e15, 1e15), inside=Machine(1e-3, 0.0))  # messages alone cost
    layout = Layout(tensor=2, pipeline=2, micro_batches=4, schedule="gpipe")
    per_micro_batch = 2 * 1e-3  # each stage (a column and a row layer): its row's Allreduce, 2 alphas on 2 ranks
    assert step_seconds(job, slow, layout)["tensor"] == pytest.approx((4 - 1 + 2) * per_micro_batch, rel=1e-6)


def test_a_group_that_straddles_two_nodes_uses_the_link_between_them():
    machine = Cluster(8, 2**30, 4, Machine(1e-6, 0.0), Machine(1e-3, 0.0), Compute(0.0, 1e9, 1e9))
    assert machine.link(1, 3) is machine.across  # ranks 3, 4, 5: two nodes
    assert machine.link(1, 4) is machine.inside and machine.link(1, 2) is machine.inside
    assert machine.link(4, 2) is machine.across  # ranks 0 and 4
    job = Job((64, 6, 32, 10), batch=64)
    assert "spans nodes" in refusal(job, Cluster(6, 2**30, 4, machine.inside, machine.across, machine.compute),
                                    Layout(data=2, tensor=3))


@pytest.mark.parametrize("job, machine, says", [
    (Job((784, 0, 10), batch=8), cluster(), "whole numbers of at least 1"),
    (Job((784, 16, 10), batch=32.5), cluster(), "whole numbers of at least 1"),
    (Job((784, 16, 10), batch=8), cluster(memory=float("nan")), "memory per rank must be positive"),
    (Job((784, 16, 10), batch=8), cluster(compute=Compute(0.0, 0.0, 1e9)), "rates must be positive"),
    (Job((784, 16, 10), batch=8, optimizer="lion"), cluster(), "optimizer must be one of"),
    (Job((784, 16, 10), batch=8, precision="float8"), cluster(), "precision must be one of")])
def test_bad_jobs_and_clusters_are_refused_with_what_to_change(job, machine, says):
    with pytest.raises(ValueError, match=says):
        plan(job, machine)


def test_predict_refuses_what_cannot_run_but_prices_what_does_not_fit():
    job, machine = Job([64, 16, 16, 10], batch=64), cluster(memory=1.0)  # (a list of widths is taken)
    with pytest.raises(ValueError, match="ZeRO-1 on the data axis"):
        predict(job, machine, Layout(data=2, tensor=2, zero=3))
    with pytest.raises(ValueError, match="micro-batches of a 32-row share"):
        predict(job, machine, Layout(data=2, pipeline=2, micro_batches=64))
    seconds, held = predict(job, machine, Layout(data=4))
    assert seconds["step"] > 0 and sum(held.values()) > machine.memory


def test_the_command_needs_a_large_models_activation_bytes(capsys):
    with pytest.raises(SystemExit):
        main(["--parameters", "7e9"])
    assert "--activation-bytes" in capsys.readouterr().err


@pytest.mark.parametrize("layout, precision, says", [
    (Layout(data=2, pipeline=2, micro_batches=2), "bfloat16", "mixed precision on the data axis alone"),
    (Layout(pipeline=2, micro_batches=2, recompute=2), "float64", "recompute activations on the data axis alone"),
    (Layout(tensor=2, micro_batches=2), "float64", "not under tensor parallelism")])
def test_the_planner_offers_no_built_layout_the_lessons_cannot_run(layout, precision, says):
    assert says in unbuildable(layout, precision)
    job = Job((64, 16, 16, 10), batch=64, precision=precision)
    assert says in refusal(job, cluster(ranks=layout.data * layout.tensor * layout.pipeline), layout)
    assert unbuildable(Layout(data=2, tensor=2, zero=1), "float64") is None
    assert "ZeRO-2 and FSDP on the data axis alone" in unbuildable(Layout(data=2, tensor=2, zero=2))
