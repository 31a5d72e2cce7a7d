"""The state file: kubelet's checkpoint format and checksum, corrupt files, atomic writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator import CheckpointError, CheckpointStore, CPUSet, CPUState, checkpoint_checksum
from allocator.checkpoint import fnv1a_32, import_kubelet_state, parse_checkpoint, render_checkpoint

# kubelet's published vectors (state_checkpoint_test.go, KEP-4540) and the V1 vector of its tests.
VECTORS = [
    ("none", "4-6", {}, 354655845),
    ("none", "1-3", {"pod": {"container1": "4-6", "container2": "1-3"}}, 3610638499),
    ("other", "1-3", {}, 1394507217),
    ("static", "0-63", {}, 1058907510),
    ("static", "2-15,17-31,34-47,49-63", {}, 4141502832),
]


@pytest.mark.parametrize(("policy", "default", "entries", "expected"), VECTORS)
def test_kubelet_vectors(policy, default, entries, expected):
    assert checkpoint_checksum(policy, default, entries) == expected


def test_rendered_text_is_go_spew():
    text = render_checkpoint("none", "1-3", {"pod": {"container2": "1-3", "container1": "4-6"}})
    assert text == (
        "(*state.CPUManagerCheckpoint){PolicyName:(string)none DefaultCPUSet:(string)1-3 "
        "Entries:(map[string]map[string]string)map[pod:map[container1:4-6 container2:1-3]] "
        "Checksum:(checksum.Checksum)0}"
    )
    assert render_checkpoint("none", "", None).endswith("Entries:(map[string]map[string]string)<nil> "
                                                        "Checksum:(checksum.Checksum)0}")
    assert fnv1a_32(b"") == 0x811C9DC5 and fnv1a_32(b"a") == 0xE40C292C


def test_v1_vector():
    assert checkpoint_checksum("static", "7-9", {"containerID1": "4-6", "containerID2": "1-3"}, v1=True) == 2026311253
    assert checkpoint_checksum("none", "1-3", {}, v1=True) == 1694838852


def _write(path: Path, doc: object) -> bytes:
    data = (json.dumps(doc) if not isinstance(doc, str) else doc).encode()
    path.write_bytes(data)
    return data


@pytest.mark.parametrize(("policy", "default", "entries", "expected"), VECTORS)
def test_reads_files_kubelet_wrote(tmp_path, policy, default, entries, expected):
    path = tmp_path / "cpu_manager_state"
    doc = {"policyName": policy, "defaultCpuSet": default, "checksum": expected}
    if entries:
        doc["entries"] = entries
    _write(path, doc)
    state = CheckpointStore(path, policy).load()
    assert state is not None
    assert state.default_cpuset == CPUSet.parse(default)
    assert {u: {n: str(c) for n, c in cs.items()} for u, cs in state.assignments.items()} == entries
    assert all(state.mode(u, n) == "exclusive" for u, cs in state.assignments.items() for n in cs)


def test_go_field_names_match_case_insensitively(tmp_path):
    # kubelet's own tests spell it "defaultCPUSet"; Go's decoder accepts that for "defaultCpuSet".
    path = tmp_path / "s"
    _write(path, {"policyName": "none", "defaultCPUSet": "4-6", "checksum": 354655845})
    assert CheckpointStore(path, "none").load().default_cpuset == CPUSet.parse("4-6")


def test_missing_file_is_none(tmp_path):
    assert CheckpointStore(tmp_path / "nothing").load() is None


def test_checksum_zero_and_unknown_fields_accepted(tmp_path):
    path = tmp_path / "s"
    _write(path, {"policyName": "numapin", "defaultCpuSet": "0-3", "entries": {"p": {"c": "4-5"}}, "checksum": 0,
                  "podEntries": {"x": {"cpuSet": "7"}}, "somethingNew": [1, 2]})
    cp = CheckpointStore(path).read()
    assert cp is not None and cp.unknown_fields == ("podEntries", "somethingNew")
    state = CheckpointStore(path).load()
    assert state.get("p", "c") == CPUSet.parse("4-5")


def test_v4_data_section_is_authoritative(tmp_path):
    # From kubelet's tests of the V4 format: the top-level V2 part is deliberately wrong.
    path = tmp_path / "s"
    _write(path, {"policyName": "other", "defaultCPUSet": "1-9", "checksum": 1234,
                  "data": '{"policyName":"static","defaultCPUSet":"7-9","entries":{"pod":{"container1":"4-6",'
                          '"container2":"1-3"}}}',
                  "dataChecksum": 1420829534})
    state = import_kubelet_state(path)
    assert state.default_cpuset == CPUSet.parse("7-9")
    assert state.get("pod", "container1") == CPUSet.parse("4-6")
    data = path.read_bytes()
    bad = json.loads(data)
    bad["dataChecksum"] = 1234
    _write(path, bad)
    with pytest.raises(CheckpointError, match="dataChecksum mismatch"):
        import_kubelet_state(path)


def test_v1_checkpoint_detected_and_migrated_with_a_container_map(tmp_path):
    path = tmp_path / "cpu_manager_state"
    data = _write(path, {"policyName": "static", "defaultCpuSet": "7-9",
                         "entries": {"containerID1": "4-6", "containerID2": "1-3"}, "checksum": 2026311253})
    with pytest.raises(CheckpointError) as e:
        import_kubelet_state(path)
    assert "V1 checkpoint" in str(e.value) and "container id" in str(e.value) and str(path) in str(e.value)
    assert path.read_bytes() == data
    state = import_kubelet_state(path, container_ids={"containerID1": ("pod", "a"), "containerID2": ("pod", "b")})
    assert state.get("pod", "a") == CPUSet.parse("4-6") and state.get("pod", "b") == CPUSet.parse("1-3")


def test_empty_v1_checksum_accepted(tmp_path):
    path = tmp_path / "s"
    _write(path, {"policyName": "none", "defaultCpuSet": "1-3", "checksum": 1694838852})
    assert CheckpointStore(path, "none").load().default_cpuset == CPUSet.parse("1-3")


BAD_FILES = [
    ("{", "not valid JSON"),
    ("[1]", "expected a JSON object"),
    ('{"policyName": 3, "defaultCpuSet": "", "checksum": 0}', "policyName must be a string"),
    ('{"policyName": "numapin", "defaultCpuSet": "3-1", "checksum": 0}', "defaultCpuSet"),
    ('{"policyName": "numapin", "defaultCpuSet": "0", "checksum": -1}', "checksum must be an unsigned"),
    ('{"policyName": "numapin", "defaultCpuSet": "0", "checksum": 12345}', "checksum mismatch"),
    ('{"policyName": "numapin", "defaultCpuSet": "0", "entries": [1], "checksum": 0}', "entries must be an object"),
    ('{"policyName": "numapin", "defaultCpuSet": "0", "entries": {"p": {"c": "x"}}, "checksum": 0}',
     "entries['p']['c']"),
    ('{"policyName": "numapin", "defaultCpuSet": "0", "entries": {"p": {"c": 1}}, "checksum": 0}',
     "entries must map pod UIDs"),
    ('{"policyName": "static", "defaultCpuSet": "0", "checksum": 0}', 'configured policy \'numapin\' differs'),
    ('{"policyName": "numapin", "defaultCpuSet": "0", "checksum": 0, "numapin": {"modes": {}, "checksum": 1}}',
     "field 'numapin' is corrupt: checksum mismatch"),
    ('{"policyName": "numapin", "defaultCpuSet": "0", "checksum": 0, "numapin": 5}', "field 'numapin' must be"),
]


@pytest.mark.parametrize(("text", "fragment"), BAD_FILES)
def test_bad_files_reported_and_never_overwritten(tmp_path, text, fragment):
    path = tmp_path / "cpu_manager_state"
    data = _write(path, text)
    store = CheckpointStore(path)
    with pytest.raises(CheckpointError) as e:
        store.load()
    msg = str(e.value)
    assert fragment in msg and str(path) in msg
    assert "move the file away" in msg  # what to do
    with pytest.raises(CheckpointError, match="refusing to overwrite"):
        store.save(CPUState(default_cpuset=CPUSet.parse("0-3")))
    assert path.read_bytes() == data
    assert [p.name for p in tmp_path.iterdir()] == ["cpu_manager_state"]


def test_modes_must_match_entries(tmp_path):
    path = tmp_path / "s"
    state = CPUState(default_cpuset=CPUSet.parse("0-1"))
    state.set("p", "c", CPUSet.parse("2-3"), "share")
    CheckpointStore(path).save(state)
    doc = json.loads(path.read_text())
    doc["numapin"]["modes"]["p"]["ghost"] = "share"
    doc["numapin"]["checksum"] = fnv1a_32(json.dumps(doc["numapin"]["modes"], sort_keys=True,
                                                     separators=(",", ":")).encode())
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=r"'ghost'.*no CPU entry"):
        CheckpointStore(path).load()


def test_force_save_replaces_a_corrupt_file(tmp_path):
    path = tmp_path / "s"
    path.write_text("garbage")
    CheckpointStore(path).save(CPUState(default_cpuset=CPUSet.parse("0-3")), force=True)
    assert CheckpointStore(path).load().default_cpuset == CPUSet.parse("0-3")


def test_saved_file_is_what_kubelet_writes(tmp_path):
    path = tmp_path / "cpu_manager_state"
    state = CPUState(default_cpuset=CPUSet.parse("0-1,4-111"))
    state.set("pod-b", "app", CPUSet.parse("2-3"))
    state.set("pod-a", "side", CPUSet.parse("112"), "share")
    CheckpointStore(path).save(state)
    doc = json.loads(path.read_bytes())
    assert list(doc)[:4] == ["policyName", "defaultCpuSet", "entries", "checksum"]
    assert doc["entries"] == {"pod-a": {"side": "112"}, "pod-b": {"app": "2-3"}}
    assert doc["checksum"] == checkpoint_checksum("numapin", "0-1,4-111", doc["entries"])
    assert doc["numapin"]["modes"] == {"pod-a": {"side": "share"}, "pod-b": {"app": "exclusive"}}
    # kubelet (a V2 reader ignoring unknown fields) verifies it: same rule, policy aside
    assert parse_checkpoint(path.read_bytes()).version == 2
    # no entries: the field is omitted, as kubelet's omitempty does
    CheckpointStore(path).save(CPUState(default_cpuset=CPUSet.parse("0-3")))
    doc = json.loads(path.read_bytes())
    assert "entries" not in doc and doc["checksum"] == checkpoint_checksum("numapin", "0-3")


uids = st.text(alphabet="abcdef0123456789-", min_size=1, max_size=12)
names = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=0x2FF, exclude_characters=":[] "),
                min_size=1, max_size=10)
cpusets = st.frozensets(st.integers(0, 300), min_size=1, max_size=20).map(CPUSet)


@settings(max_examples=60, deadline=None)
@given(
    default=st.frozensets(st.integers(0, 300), max_size=30).map(CPUSet),
    assignments=st.dictionaries(uids, st.dictionaries(names, st.tuples(cpusets, st.sampled_from(["exclusive",
                                                                                                 "share"])),
                                                      min_size=1, max_size=3), max_size=4),
)
def test_round_trip(tmp_path_factory, default, assignments):
    path = tmp_path_factory.mktemp("rt") / "state"
    state = CPUState(default_cpuset=default)
    for uid, containers in assignments.items():
        for name, (cpus, mode) in containers.items():
            state.set(uid, name, cpus, mode)
    store = CheckpointStore(path)
    store.save(state)
    back = store.load()
    assert back == state
    # and kubelet's checksum of what we wrote verifies
    doc = json.loads(path.read_bytes())
    assert doc["checksum"] == checkpoint_checksum("numapin", doc["defaultCpuSet"], doc.get("entries", {}))


def test_failed_write_never_replaces_the_file(tmp_path):
    """A write that fails half-way (here: the file size limit, EFBIG) leaves the old file and no temp file."""
    path = tmp_path / "cpu_manager_state"
    old = CPUState(default_cpuset=CPUSet.parse("0-3"))
    CheckpointStore(path).save(old)
    before = path.read_bytes()
    script = textwrap.dedent(f"""
        import resource, signal, sys
        from allocator import CheckpointStore, CheckpointError, CPUSet, CPUState
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))
        state = CPUState(default_cpuset=CPUSet.parse("0"))
        for i in range(200):
            state.set(f"pod-{{i}}", "container-with-a-long-name", CPUSet([i + 1]))
        try:
            CheckpointStore({str(path)!r}).save(state)
        except CheckpointError as e:
            print("ERR", e)
            sys.exit(3)
        sys.exit(0)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], check=False)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "the previous file is unchanged" in proc.stdout
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu_manager_state"]


def test_save_replaces_by_rename(tmp_path):
    path = tmp_path / "cpu_manager_state"
    CheckpointStore(path).save(CPUState(default_cpuset=CPUSet.parse("0-3")))
    first = os.stat(path).st_ino
    CheckpointStore(path).save(CPUState(default_cpuset=CPUSet.parse("0-7")))
    assert os.stat(path).st_ino != first  # a new file renamed over the old one, not rewritten in place
    assert CheckpointStore(path).load().default_cpuset == CPUSet.parse("0-7")


def test_import_kubelet_state(tmp_path):
    path = tmp_path / "cpu_manager_state"
    entries = {"uid-1": {"app": "2-3"}}
    _write(path, {"policyName": "static", "defaultCpuSet": "0-1,4-7", "entries": entries,
                  "checksum": checkpoint_checksum("static", "0-1,4-7", entries)})
    state = import_kubelet_state(path)
    assert state.get("uid-1", "app") == CPUSet.parse("2-3") and state.mode("uid-1", "app") == "exclusive"
    with pytest.raises(CheckpointError, match="does not exist"):
        import_kubelet_state(tmp_path / "missing")
    _write(path, {"policyName": "none", "defaultCpuSet": "", "checksum": 0})
    with pytest.raises(CheckpointError, match="differs from state checkpoint policy 'none'"):
        import_kubelet_state(path)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**65) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["policyName", "defaultCpuSet", "entries", "checksum", "numapin", "modes", "data",
                         "dataChecksum", "pod", "c", "x"]), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_any_json_is_a_state_or_a_checkpoint_error(doc):
    """Whatever the file holds, loading gives a state or a CheckpointError, never another exception."""
    try:
        cp = parse_checkpoint(json.dumps(doc), "f")
    except CheckpointError as e:
        assert str(e).startswith("f")
    else:
        assert isinstance(cp.default_cpuset, CPUSet)


def test_leftover_temp_files_of_killed_writers_are_cleaned_and_nothing_else(tmp_path):
    store = CheckpointStore(tmp_path / "cpu_manager_state", "numapin")
    store.save(CPUState(default_cpuset=CPUSet.parse("0-3")))
    leftovers = [tmp_path / f".cpu_manager_state.{h}.tmp" for h in ("0123456789ab", "ffffffffffff")]
    for p in leftovers:
        p.write_bytes(b'{"partial')
    keep = [tmp_path / ".cpu_manager_state.xyz.tmp", tmp_path / ".other.0123456789ab.tmp",
            tmp_path / "cpu_manager_state.0123456789ab.tmp"]
    for p in keep:
        p.write_text("not ours")
    (tmp_path / ".cpu_manager_state.aaaaaaaaaaaa.tmp").symlink_to(tmp_path / "cpu_manager_state")
    assert sorted(store.clean_leftovers()) == sorted(leftovers)
    assert all(p.exists() for p in keep) and store.load() is not None
    assert (tmp_path / ".cpu_manager_state.aaaaaaaaaaaa.tmp").is_symlink()
    assert CheckpointStore(tmp_path / "missing" / "s").clean_leftovers() == []
