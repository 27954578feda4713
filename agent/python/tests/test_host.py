"""The push's `host`: the container's memory limit and
usage read from a fake cgroup tree (v2, v1, none; a pod's limit one level
above the container's; a container without a cgroup namespace, whose own
cgroup is mounted as the root)."""

from pathlib import Path

from conftest import closed_port, memprof_agent
from memprof_agent import _host

GiB = 1 << 30


def write(root, path, text):
    p = Path(root) / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def v2_tree(root, cgroup="/kubepods/pod1/ctr", mount_root="/", pod_limit=str(8 * GiB), ctr_limit="max"):
    write(root, "/proc/self/cgroup", "0::%s\n" % cgroup)
    write(root, "/proc/self/mountinfo",
          "25 1 0:22 / / rw - overlay overlay rw\n"
          "30 25 0:26 %s /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n" % mount_root)
    rel = cgroup[len(mount_root.rstrip("/")):] if mount_root != "/" else cgroup
    ctr = "/sys/fs/cgroup" + rel
    write(root, ctr + "/memory.current", "%d\n" % (3 * GiB))
    write(root, ctr + "/memory.max", ctr_limit + "\n")
    write(root, ctr + "/memory.stat", "anon 2147483648\nfile 1073741824\ninactive_file 805306368\nactive_file 268435456\n")
    if mount_root == "/":
        write(root, "/sys/fs/cgroup/kubepods/pod1/memory.max", pod_limit + "\n")
        write(root, "/sys/fs/cgroup/kubepods/memory.max", "max\n")
    return ctr


def test_v2_the_smallest_limit_of_the_cgroup_and_its_ancestors_and_the_working_set(tmp_path):
    v2_tree(tmp_path)
    r = _host.HostReader(str(tmp_path))
    out = r.read(123, now=0.0)
    assert out == {"rssBytes": 123, "cgroup": "v2", "limitBytes": 8 * GiB, "cgroupUsageBytes": 3 * GiB,
                   "workingSetBytes": 3 * GiB - 805306368}
    assert r.dir == "/sys/fs/cgroup/kubepods/pod1/ctr"


def test_v2_a_container_limit_below_the_pods_wins(tmp_path):
    v2_tree(tmp_path, ctr_limit=str(6 * GiB))
    assert _host.HostReader(str(tmp_path)).read(1)["limitBytes"] == 6 * GiB


def test_v2_without_a_cgroup_namespace_the_mount_root_is_the_containers_cgroup(tmp_path):
    v2_tree(tmp_path, cgroup="/kubepods/pod1/ctr", mount_root="/kubepods/pod1/ctr", ctr_limit=str(5 * GiB))
    r = _host.HostReader(str(tmp_path))
    out = r.read(1)
    assert r.dir == "/sys/fs/cgroup" and out["limitBytes"] == 5 * GiB and out["cgroupUsageBytes"] == 3 * GiB


def test_v2_no_limit_anywhere_is_null_and_limits_are_reread_after_the_refresh(tmp_path):
    ctr = v2_tree(tmp_path, pod_limit="max")
    r = _host.HostReader(str(tmp_path))
    assert r.read(1, now=100.0)["limitBytes"] is None
    # An in-place resize sets a limit: seen once the refresh interval has passed.
    write(tmp_path, ctr + "/memory.max", "%d\n" % (4 * GiB))
    assert r.read(1, now=100.0 + _host.LIMIT_REFRESH / 2)["limitBytes"] is None
    assert r.read(1, now=100.0 + _host.LIMIT_REFRESH + 1)["limitBytes"] == 4 * GiB


def test_v1_memory_controller_and_its_unlimited_value(tmp_path):
    write(tmp_path, "/proc/self/cgroup", "12:pids:/x\n4:memory:/kubepods/pod2/ctr\n0::/\n")
    write(tmp_path, "/proc/self/mountinfo",
          "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
          "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
    base = "/sys/fs/cgroup/memory/kubepods/pod2"
    write(tmp_path, base + "/ctr/memory.usage_in_bytes", "%d\n" % GiB)
    write(tmp_path, base + "/ctr/memory.limit_in_bytes", "9223372036854771712\n")
    write(tmp_path, base + "/ctr/memory.stat", "cache 100\ntotal_inactive_file 268435456\n")
    write(tmp_path, base + "/memory.limit_in_bytes", "%d\n" % (2 * GiB))
    write(tmp_path, "/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")
    # The hybrid host's cgroup2 mount has no memory controller (no memory.current): v1 is used.
    out = _host.HostReader(str(tmp_path)).read(7)
    assert out == {"rssBytes": 7, "cgroup": "v1", "limitBytes": 2 * GiB, "cgroupUsageBytes": GiB,
                   "workingSetBytes": GiB - 268435456}


def test_no_cgroup_files_means_nulls_and_no_error(tmp_path):
    out = _host.HostReader(str(tmp_path)).read(5)
    assert out == {"rssBytes": 5, "limitBytes": None, "cgroupUsageBytes": None}


def test_every_push_carries_host(fake, tmp_path):
    v2_tree(tmp_path)
    _host.READER[0] = _host.HostReader(str(tmp_path))  # conftest's clean_agent puts the real one back
    memprof_agent.start(interval=60, url="http://127.0.0.1:%d/v1/agent" % closed_port())
    push = memprof_agent._agent.build("sample")
    host = push["host"]
    assert host["rssBytes"] == push["rssBytes"] > 0
    assert host["limitBytes"] == 8 * GiB and host["cgroupUsageBytes"] == 3 * GiB


def test_a_path_from_another_cgroup_namespace_stays_inside_the_mount(tmp_path):
    v2_tree(tmp_path, cgroup="/kubepods/pod1/ctr", mount_root="/kubepods/pod1/ctr", ctr_limit=str(5 * GiB))
    write(tmp_path, "/proc/self/cgroup", "0::/../elsewhere\n")
    write(tmp_path, "/sys/fs/elsewhere/memory.current", "1\n")  # outside the cgroup mount: never read
    write(tmp_path, "/sys/fs/elsewhere/memory.max", "1\n")
    r = _host.HostReader(str(tmp_path))
    assert r.read(1)["limitBytes"] == 5 * GiB and r.dir == "/sys/fs/cgroup"
