"""usable_cores: what the lessons say about cores is about the cores a rank may use, not the machine's."""

import os

from nnlib.course.environment import usable_cores


def affinity() -> int:
    return len(os.sched_getaffinity(0))


def test_a_quota_caps_the_cores_and_rounds_down_to_at_least_one(tmp_path):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("150000 100000\n")  # 1.5 cores: one whole core
    assert usable_cores(str(cpu_max)) == 1
    cpu_max.write_text("50000 100000\n")  # half a core still runs a rank
    assert usable_cores(str(cpu_max)) == 1
    cpu_max.write_text(f"{100000 * (affinity() + 3)} 100000\n")  # a quota above the affinity: the affinity
    assert usable_cores(str(cpu_max)) == affinity()


def test_no_quota_or_no_cgroup_file_leaves_the_affinity(tmp_path):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("max 100000\n")
    assert usable_cores(str(cpu_max)) == affinity()
    assert usable_cores(str(tmp_path / "absent")) == affinity()


def test_pinned_to_one_core_the_process_has_one(tmp_path):
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})  # as taskset -c does
        assert usable_cores(str(tmp_path / "absent")) == 1
    finally:
        os.sched_setaffinity(0, before)
