"""NCCL's own choice of all-reduce algorithm and protocol (issue 79, item 3), against a table worked by hand.

The expected choices below were computed from NVIDIA/nccl v2.30.7-1's ``src/graph/tuning.cc`` (``ncclTopoTuneModel``,
``treeCorrectionFactor``, ``ncclTopoGetAlgoTime``) and ``src/enqueue.cc`` (``topoGetAlgoInfo``: the fastest, ties to
the first in loop order), not by calling the code under test.

The machine: Perlmutter's GPU node as the kit describes it: 4 A100 (compute capability 8.0: the Ampere row of
every table), an AMD CPU, NVLink between the GPUs, 4 channels (one per NIC), LL128 allowed across nodes. The bus
bandwidth is 100 GB/s: the NVLink pair's 100 GB/s on one node; across nodes the node's 4 × 25 GB/s of NICs, no more
than the 100 GB/s inside. The communicator has 2 × 4 = 8 channels (rings doubled when they connect).

Bandwidths (GB/s, per channel caps × 4 channels; column by nodes: 1, 2, more):
- ring LL: min(llMaxBw, 100 × .5); llMaxBw is 87.7 on one Ampere node, 22.5 and 19.0 across nodes with an AMD
  CPU -> 50, 22.5, 19.0
- ring LL128: min(100 × .92, 4 × 20) = 80; ring Simple: 100
- tree: min(100 × .92, 4 × perChMaxTreeBw (24.0, 23.6, 17.8)) -> 92, 92, 71.2 (Simple);
  LL: min(that / 3.8, llMaxBw) -> 24.21, 22.5, 18.74;
  LL128: min(that × (7/9 on one node, 120/128 across), 4 × 20) -> 71.56, 80, 66.75
- the rate of the whole buffer: ring × p / 2(p-1) (p = 4 × nodes), tree × 0.5

Latencies (µs) = base (tree 6.8/14/8.4, ring 6.6/14/8.4 for LL/LL128/Simple) + per step:
- ring: 2(p-1) steps, 2(N-1) of them between nodes at the ring's network latency (2.7/4.0/14), the rest at
  max(NVLink latency (0.6/1.9/3.4), network overhead: 0 on one node, else AMD's 2 µs, ×3 for Simple)
- tree: 2((4-1) × NVLink latency (0.6/1.25/4.0) + log2(N) × network latency (5.0/8.5/14))

    nodes   tree LL  tree LL128  tree Simple  ring LL   ring LL128  ring Simple (before the plateau)
    1        10.4      21.5        32.4        10.2       25.4         28.8
    2        20.4      38.5        60.4        36.0       46.0        108.4
    8        40.4      72.5       116.4       140.4      166.0        492.4
    32       60.4     106.5       172.4       558.0      646.0       2028.4
    128      80.4     140.5       228.4      2228.4     2566.0       8172.4

    rate (GB/s)  tree LL  tree LL128  tree Simple  ring LL   ring LL128  ring Simple
    1            12.105    35.778      46.0       33.333     53.333      66.667
    2            11.25     40.0        46.0       12.857     45.714      57.143
    8             9.368    33.375      35.6        9.806     41.290      51.613
    32            9.368    33.375      35.6        9.575     40.315      50.394
    128           9.368    33.375      35.6        9.519     40.078      50.098

Then per call: the tree's rate × treeCorrectionFactor[protocol][log2(bytes / 64)] (LL/LL128/Simple: 64 KiB,
index 10: .6/.6/.6; 1 MiB, index 14: .5/.6/.5; 25 MiB, index 18: .9/.9/.7; 256 MiB, index 22: 1.0/1.0/.9); the
multi-node ring's Simple latency × 1.4 (Ampere) once bytes / (8 channels × p ranks) >= 64; time = latency + bytes /
(1000 × rate). The fastest two of each cell (µs):

    64 KiB:  1 node ring/LL 12.2 < tree/LL 19.4;   2 tree/LL 30.1 < ring/LL 41.1;   8 tree/LL 52.1 < tree/LL128
             75.8;   32 tree/LL 72.1 < tree/LL128 109.8;   128 tree/LL 92.1 < tree/LL128 143.8
    1 MiB:   1 ring/LL 41.7 < ring/Simple 44.5;   2 ring/LL128 68.9 < tree/LL128 82.2;   8 tree/LL128 124.9 <
             tree/Simple 175.3;   32 tree/LL128 158.9 < tree/Simple 231.3;   128 tree/LL128 192.9 < tree/Simple 287.3
    25 MiB:  1 ring/Simple 422.0 < ring/LL128 516.9;   2 ring/Simple 610.5 < ring/LL128 619.4;   8 ring/LL128 800.9
             < tree/LL128 945.2;   32 tree/LL128 979.2 < tree/Simple 1224.3;   128 tree/LL128 1013.2 < tree/Simple
             1280.3
    256 MiB: 1 ring/Simple 4055.3 < ring/LL128 5058.6;   2 ring/Simple 4849.4 < ring/LL128 5918.0;   8 ring/Simple
             5890.3 < ring/LL128 6667.2;   32 ring/LL128 7304.5 < tree/LL128 8149.5;   128 tree/LL128 8183.5 <
             tree/Simple 8606.5

(For example 25 MiB on 8 nodes: ring/LL128 166.0 + 26,214,400 / (1000 × 41.290) = 800.9; tree/LL128 72.5 +
26,214,400 / (1000 × 33.375 × 0.9) = 945.2; ring/Simple 492.4 × 1.4 + 26,214,400 / (1000 × 51.613) = 1197.3.)
"""

import pytest

from dlscale.scaling.collectives import allreduce_choice, hierarchical_allreduce, nccl_bus_gbs
from dlscale.scaling.nccl import NCCL_VERSION, NcclNode, nccl_allreduce_times, nccl_choice, nccl_tables, release
from dlscale.scaling.projection import Workload, project_efficiency
from dlscale.scaling.sites import PERLMUTTER, machine

KIB, MIB = 2**10, 2**20
NODES = (1, 2, 8, 32, 128)
#: The hand-worked table: message size -> NCCL's (algorithm, protocol) on 1, 2, 8, 32 and 128 nodes.
EXPECTED = {
    64 * KIB: ("ring/LL", "tree/LL", "tree/LL", "tree/LL", "tree/LL"),
    1 * MIB: ("ring/LL", "ring/LL128", "tree/LL128", "tree/LL128", "tree/LL128"),
    25 * MIB: ("ring/Simple", "ring/Simple", "ring/LL128", "tree/LL128", "tree/LL128"),
    256 * MIB: ("ring/Simple", "ring/Simple", "ring/Simple", "ring/LL128", "tree/LL128"),
}
#: The latencies (µs) of the docstring's first table, per node count: tree LL, LL128, Simple, ring LL, LL128, Simple.
LATENCIES = {
    1: (10.4, 21.5, 32.4, 10.2, 25.4, 28.8),
    2: (20.4, 38.5, 60.4, 36.0, 46.0, 108.4),
    8: (40.4, 72.5, 116.4, 140.4, 166.0, 492.4),
    32: (60.4, 106.5, 172.4, 558.0, 646.0, 2028.4),
    128: (80.4, 140.5, 228.4, 2228.4, 2566.0, 8172.4),
}
RATES = {
    1: (12.105, 35.778, 46.0, 33.333, 53.333, 66.667),
    2: (11.25, 40.0, 46.0, 12.857, 45.714, 57.143),
    8: (9.368, 33.375, 35.6, 9.806, 41.290, 51.613),
    32: (9.368, 33.375, 35.6, 9.575, 40.315, 50.394),
    128: (9.368, 33.375, 35.6, 9.519, 40.078, 50.098),
}
ORDER = [(a, p) for a in ("tree", "ring") for p in ("LL", "LL128", "Simple")]


def test_perlmutters_node_is_the_docstrings_machine():
    assert PERLMUTTER.nccl == NcclNode(compute_capability=8.0, cpu="amd", nvlink=True, channels=4, nic_near_gpu=True)
    for nodes in NODES:
        assert nccl_bus_gbs(PERLMUTTER.gpus_per_node, nodes, PERLMUTTER.inside, PERLMUTTER.between) == pytest.approx(
            100.0
        )


@pytest.mark.parametrize("nodes", NODES)
def test_the_latencies_and_bandwidths_are_nccls(nodes):
    tables = nccl_tables(nodes, 4, 100.0, PERLMUTTER.nccl)
    assert list(tables) == ORDER  # (NCCL's loop order: the tree first, LL before LL128 before Simple)
    for key, latency, rate in zip(ORDER, LATENCIES[nodes], RATES[nodes]):
        assert tables[key][0] == pytest.approx(latency, abs=0.005), key
        assert tables[key][1] == pytest.approx(rate, abs=0.0005), key


@pytest.mark.parametrize("size", list(EXPECTED))
def test_the_choice_reproduces_the_hand_worked_table(size):
    site = PERLMUTTER
    for nodes, expected in zip(NODES, EXPECTED[size]):
        chosen = allreduce_choice(size, site.gpus_per_node, nodes, site.inside, site.between, "auto", site.nccl)
        assert chosen == expected, (size, nodes)
        algorithm, protocol, seconds = nccl_choice(size, nodes, 4, 100.0, site.nccl)
        assert f"{algorithm}/{protocol}" == expected
        # and the model prices the call at what NCCL's model gives its choice
        assert hierarchical_allreduce(size, 4, nodes, site.inside, site.between, "auto", site.nccl) == seconds


def test_the_worked_example_and_the_plateau():
    # 25 MiB on 8 nodes, the docstring's example: ring/LL128 800.9 µs, tree/LL128 945.2, ring/Simple 1197.3
    times = nccl_allreduce_times(25 * MIB, 8, 4, 100.0, PERLMUTTER.nccl)
    assert times["ring", "LL128"] * 1e6 == pytest.approx(800.9, abs=0.05)
    assert times["tree", "LL128"] * 1e6 == pytest.approx(945.2, abs=0.05)
    assert times["ring", "Simple"] * 1e6 == pytest.approx(1197.3, abs=0.05)
    # 64 KiB on 128 nodes: 65,536 / (8 channels × 512 ranks) = 16 < 64 bytes, no plateau: 8172.4 + 65536 / 50098
    small = nccl_allreduce_times(64 * KIB, 128, 4, 100.0, PERLMUTTER.nccl)
    assert small["ring", "Simple"] * 1e6 == pytest.approx(8172.4 + 65536 / (1000 * 50.098), abs=0.05)


def test_which_protocols_nccl_enables():
    # LL128 needs Volta or later, and NVLink inside the node; across nodes, a NIC near the GPU (before Hopper)
    def protocols(nodes, **node):
        return {p for _, p in nccl_tables(nodes, 4, 25.0, NcclNode(**node))}

    assert protocols(2, compute_capability=6.0) == {"LL", "Simple"}  # P100
    assert protocols(2, compute_capability=7.0) == {"LL", "LL128", "Simple"}
    assert protocols(2, compute_capability=8.0, nvlink=False) == {"LL", "Simple"}
    assert protocols(1, compute_capability=8.0, nic_near_gpu=False) == {"LL", "LL128", "Simple"}
    assert protocols(2, compute_capability=8.0, nic_near_gpu=False) == {"LL", "Simple"}
    assert protocols(2, compute_capability=9.0, nic_near_gpu=False) == {"LL", "LL128", "Simple"}
    # one rank communicates nothing
    assert nccl_choice(2**20, 1, 1, 25.0, NcclNode())[2] == 0.0


def test_before_ampere_the_ring_plateau_is_1_9_and_an_intel_cpus_overhead_1_us():
    # V100 (Volta row), Intel, NVLink, 4 GPUs, 4 channels, 25 GB/s of bus; 2 nodes, 8 ranks, 14 steps, 2 between
    # ring Simple latency: 8.4 + 12 × max(3.4, 3 × 1.0) + 2 × 14 = 77.2 µs; with 2^20 bytes, 2^20 / (8 × 8) >= 64:
    # × 1.9 = 146.68; rate 25 × 8/14 = 14.2857 GB/s -> 146.68 + 1048576 / 14285.7 = 220.08 µs
    volta = NcclNode(compute_capability=7.0, cpu="intel", nvlink=True, channels=4)
    assert nccl_allreduce_times(MIB, 2, 4, 25.0, volta)["ring", "Simple"] * 1e6 == pytest.approx(220.08, abs=0.01)
    # ring LL: 6.6 + 12 × max(0.6, 1.0) + 2 × 2.7 = 24.0 µs; min(llMaxBw = 39.0 (Intel, 2 nodes), 12.5) × 8/14
    assert nccl_tables(2, 4, 25.0, volta)["ring", "LL"] == pytest.approx((24.0, 12.5 * 8 / 14))


def test_a_projection_on_an_nccl_site_reports_and_prices_nccls_choice():
    rows = project_efficiency(Workload("yardstick", 25_000_000, 2e-4, 64), PERLMUTTER)
    assert {r["algorithm"] for r in rows} <= {f"{a}/{p}" for a, p in ORDER}
    # a machine that does not run NCCL keeps the textbook algorithms, on its own α and β
    textbook = machine("no NCCL", 4, 100, 25, nccl=None)
    assert {r["algorithm"] for r in project_efficiency(Workload("yardstick", 25_000_000, 2e-4, 64), textbook)} <= {
        "ring",
        "tree",
        "double_tree",
    }


def test_a_machine_file_says_what_nccl_reads_of_its_node(tmp_path):
    from dlscale.scaling.sites import MachineError, load_machine

    path = tmp_path / "mine.yaml"
    links = "gpus_per_node: 4\ninside: {bandwidth_gbs: 300}\nbetween: {bandwidth_gbs: 50}\n"
    path.write_text(links)
    assert load_machine(path).nccl == NcclNode()  # (an A100-class node unless told)
    path.write_text(links + "nccl: {compute_capability: 9.0, cpu: amd, channels: 8}\n")
    assert load_machine(path).nccl == NcclNode(compute_capability=9.0, cpu="amd", channels=8)
    path.write_text(links + "nccl: false\n")
    assert load_machine(path).nccl is None
    path.write_text(links + 'nccl: {version: "2.3.7"}\n')  # (a site's old container: rings and LL only)
    assert load_machine(path).nccl == NcclNode(version="2.3.7") and not load_machine(path).nccl.has("tree")
    for text, says in (
        ("nccl: {gpu: h100}\n", "unknown key nccl.gpu"),
        ("nccl: {version: 2.30}\n", 'nccl.version must be quoted, as "2.30.7"'),
        ('nccl: {version: "two"}\n', "version must be like 2.4"),
        ("nccl: {cpu: arm}\n", "cpu must be one of"),
        ("nccl: {channels: true}\n", "nccl.channels cannot be True"),
        ("nccl: 3\n", "nccl must be a mapping"),
    ):
        path.write_text(links + text)
        with pytest.raises(MachineError, match=says):
            load_machine(path)


#: What each NCCL release had of the model's algorithms and protocols (NCCL's user guide: NCCL_LL_THRESHOLD "since
#: 2.1"; tags v2.4.2-1 "Add tree algorithms for allreduce" and v2.5.6-1 "Add LL128 Protocol").
RELEASES = {
    "2.0.5": {("ring", "Simple")},
    "2.1": {("ring", "LL"), ("ring", "Simple")},
    "2.3.7": {("ring", "LL"), ("ring", "Simple")},
    "2.4.8": {(a, p) for a in ("tree", "ring") for p in ("LL", "Simple")},
    "2.5.6": set(ORDER),
}


@pytest.mark.parametrize("version", list(RELEASES))
def test_an_older_nccl_chooses_only_what_its_release_had(version):
    node = NcclNode(compute_capability=8.0, cpu="amd", nvlink=True, channels=4, version=version)
    for nodes in NODES:
        tables = nccl_tables(nodes, 4, 100.0, node)
        assert set(tables) == RELEASES[version], nodes
        # what it had is priced as today's NCCL prices it
        assert all(tables[key] == nccl_tables(nodes, 4, 100.0, PERLMUTTER.nccl)[key] for key in tables)
        for size in EXPECTED:
            algorithm, protocol, _ = nccl_choice(size, nodes, 4, 100.0, node)
            assert (algorithm, protocol) in RELEASES[version]
            assert algorithm != "tree" or release(version) >= (2, 4)
            assert protocol != "LL128" or release(version) >= (2, 5)
    assert (version == "2.5.6") == ("NCCL" not in node.describe())  # (the release is said where it limits)


def test_by_default_the_choice_is_todays_and_a_release_that_had_everything_chooses_the_same():
    assert NcclNode().version == NCCL_VERSION == "2.30.7" and PERLMUTTER.nccl.version == NCCL_VERSION
    site = PERLMUTTER
    since_ll128 = NcclNode(compute_capability=8.0, cpu="amd", nvlink=True, channels=4, version="2.5")
    for size, expected in EXPECTED.items():
        for nodes, chosen in zip(NODES, expected):
            algorithm, protocol, seconds = nccl_choice(size, nodes, 4, 100.0, since_ll128)
            assert (f"{algorithm}/{protocol}", seconds) == (chosen, nccl_choice(size, nodes, 4, 100.0, site.nccl)[2])
    for version in ("1.3.4", "2", "two.four"):
        with pytest.raises(ValueError, match="version must be"):
            NcclNode(version=version)


def test_a_cases_nccl_release_reaches_the_projection():
    import dataclasses

    from dlscale.scaling.published import CASES

    akiba = next(case for case in CASES if case.name == "Akiba et al. 2017")
    assert akiba.nccl_version == "2.0.5"  # (the paper's)
    today = dataclasses.replace(akiba, nccl_version=NCCL_VERSION)
    then, now = akiba.predict(), today.predict()
    # one 51 MB message over 1,024 P100: NCCL 2.0's ring, where today's NCCL would take its tree
    assert (then["algorithm"], now["algorithm"]) == ("ring/Simple", "tree/Simple")
    assert then["communication_s"] > now["communication_s"] and then["efficiency"] < now["efficiency"]
