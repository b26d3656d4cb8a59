"""``leoflow_agent.oom``: the OOM kill count of the agent's own memory cgroup, read from a cgroup tree laid out as
the kernel lays it out (cgroup v1 inside a container and on a machine, cgroup v2, hybrid), in a temporary
directory."""

from __future__ import annotations

from pathlib import Path

from leoflow_agent.oom import OomWatch, oom_kills

V1_CONTROL = "oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"
V2_EVENTS = "low 0\nhigh 0\nmax 12\noom 3\noom_kill {n}\noom_group_kill 0\n"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_v1_inside_a_container_reads_the_container_s_own_cgroup_at_the_mount(tmp_path):
    """The container sees its host path in /proc/self/cgroup, but its own cgroup at the mount's root."""
    proc = _write(tmp_path / "cgroup", "12:pids:/kubepods/burstable/podx/c1\n4:memory:/kubepods/burstable/podx/c1\n"
                                       "0::/\n")
    _write(tmp_path / "fs" / "memory" / "memory.oom_control", V1_CONTROL.format(n=2))
    assert oom_kills(proc, tmp_path / "fs") == 2


def test_v1_on_a_machine_reads_the_cgroup_at_its_path(tmp_path):
    proc = _write(tmp_path / "cgroup", "4:memory:/user.slice/attempt\n")
    _write(tmp_path / "fs" / "memory" / "user.slice" / "attempt" / "memory.oom_control", V1_CONTROL.format(n=5))
    _write(tmp_path / "fs" / "memory" / "memory.oom_control", V1_CONTROL.format(n=99))
    assert oom_kills(proc, tmp_path / "fs") == 5


def test_the_root_cgroup_is_never_read(tmp_path):
    """A count there would be the whole machine's OOM kills, not the attempt's."""
    proc = _write(tmp_path / "cgroup", "4:memory:/\n0::/\n")
    _write(tmp_path / "fs" / "memory" / "memory.oom_control", V1_CONTROL.format(n=7))
    assert oom_kills(proc, tmp_path / "fs") is None


def test_v2_reads_memory_events_of_its_cgroup(tmp_path):
    proc = _write(tmp_path / "cgroup", "0::/kubepods.slice/pod/c1\n")
    _write(tmp_path / "fs" / "kubepods.slice" / "pod" / "c1" / "memory.events", V2_EVENTS.format(n=1))
    assert oom_kills(proc, tmp_path / "fs") == 1


def test_no_memory_controller_or_no_file_is_no_count(tmp_path):
    assert oom_kills(tmp_path / "missing", tmp_path) is None
    proc = _write(tmp_path / "cgroup", "12:pids:/a\n4:memory:/a\n")
    assert oom_kills(proc, tmp_path / "fs") is None
    _write(tmp_path / "fs" / "memory" / "a" / "memory.oom_control", "oom_kill_disable 0\n")  # an old kernel
    assert oom_kills(proc, tmp_path / "fs") is None


def test_the_watch_says_true_only_once_the_count_grew():
    counts = iter([3, 3, 4])
    watch = OomWatch(lambda: next(counts))
    assert watch() is False and watch() is True
    assert OomWatch(lambda: None)() is False
