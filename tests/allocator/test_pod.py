from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from allocator.errors import PodSpecError
from allocator.intent import INTENT_ANNOTATION, decode_intent, encode_intent
from allocator.pod import PodInfo, container_mode, guaranteed_cpus, pod_guaranteed_cpus
from allocator.quantity import cpu_milli, memory_bytes, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", Fraction(2)),
        ("1500m", Fraction(3, 2)),
        ("0.5", Fraction(1, 2)),
        ("2k", Fraction(2000)),
        ("1Gi", Fraction(2**30)),
        ("1e3", Fraction(1000)),
        ("1.5E-3", Fraction(3, 2000)),
        (".5", Fraction(1, 2)),
        (3, Fraction(3)),
        (0.25, Fraction(1, 4)),
        ("100n", Fraction(1, 10**7)),
    ],
)
def test_parse_quantity(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "2kk", "1Gb", "--1", True, None, float("nan"), "1e999"])
def test_bad_quantities(text):
    with pytest.raises(PodSpecError):
        parse_quantity(text)  # type: ignore[arg-type]


def test_cpu_milli_rounds_up_and_rejects_negative():
    assert cpu_milli("1500m") == 1500
    assert cpu_milli("100u") == 1
    assert memory_bytes("1.5Ki") == 1536
    with pytest.raises(PodSpecError, match="must not be negative"):
        cpu_milli("-1")


def pod(containers, init=(), annotations=None, uid="u1"):
    def c(name, cpu=None, mem="1Gi", limits=True, restart=None):
        res = {}
        if cpu is not None:
            res = {"requests": {"cpu": cpu, "memory": mem}}
            if limits:
                res["limits"] = {"cpu": cpu, "memory": mem}
        d = {"name": name, "resources": res}
        if restart:
            d["restartPolicy"] = restart
        return d

    return {
        "metadata": {"uid": uid, "name": "p", "namespace": "ns", "annotations": annotations or {}},
        "spec": {"containers": [c(*x) for x in containers], "initContainers": [c(*x) for x in init]},
    }


def test_kubelet_eligibility():
    p = PodInfo.from_pod(pod([("a", "2"), ("b", "1500m")]))
    assert p.qos_class == "Guaranteed"
    assert guaranteed_cpus(p, p.container("a")) == 2
    assert guaranteed_cpus(p, p.container("b")) == 0
    assert container_mode(p, p.container("a")) == "exclusive"
    assert container_mode(p, p.container("b")) == "shared"
    burst = PodInfo.from_pod(pod([("a", "2", "1Gi", False)]))
    assert burst.qos_class == "Burstable"
    assert guaranteed_cpus(burst, burst.container("a")) == 0
    best = PodInfo.from_pod(pod([("a",)]))
    assert best.qos_class == "BestEffort"


def test_crane_modes():
    raw = pod([("a", "2"), ("b", "1500m")], annotations={"qos.gocrane.io/cpu-manager": " Share "})
    raw["spec"]["containers"].append({"name": "c", "resources": {}})  # makes the pod Burstable
    p = PodInfo.from_pod(raw)
    assert p.qos_class == "Burstable" and p.cpu_manager == "share"
    assert container_mode(p, p.container("a")) == "share"
    assert guaranteed_cpus(p, p.container("a")) == 2
    assert container_mode(p, p.container("b")) == "shared"
    none = PodInfo.from_pod(pod([("a", "2")], annotations={"qos.gocrane.io/cpu-manager": "none"}))
    assert guaranteed_cpus(none, none.container("a")) == 0
    with pytest.raises(PodSpecError, match="none, exclusive, share"):
        PodInfo.from_pod(pod([("a", "2")], annotations={"qos.gocrane.io/cpu-manager": "dedicated"}))


def test_pod_level_count_with_sidecars():
    # init 4; sidecar 1 then init 3 (=4); apps 2+1 plus sidecar 1 = 4 -> max(4, 4)
    p = PodInfo.from_pod(pod([("a", "2"), ("b", "1")], init=[("i1", "4"), ("s", "1", "1Gi", True, "Always"),
                                                           ("i2", "3")]))
    assert [c.role for c in p.containers] == ["init", "sidecar", "init", "app", "app"]
    assert pod_guaranteed_cpus(p) == 4
    p2 = PodInfo.from_pod(pod([("a", "2")], init=[("s", "2", "1Gi", True, "Always"), ("i", "5")]))
    assert pod_guaranteed_cpus(p2) == 7


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda p: p["spec"].update(containers=[]), "spec.containers"),
        (lambda p: p["spec"]["containers"][0].update(name=""), "spec.containers[0].name"),
        (lambda p: p["spec"]["containers"][0]["resources"]["requests"].update(cpu="lots"),
         "spec.containers[0].resources.requests.cpu"),
        (lambda p: p["spec"]["containers"].append(dict(p["spec"]["containers"][0])), "duplicate"),
        (lambda p: p["metadata"].update(annotations={"x": 1}), "metadata.annotations"),
        (lambda p: p.update(spec=[]), "spec must be a mapping"),
    ],
)
def test_bad_pods_name_the_field(mutate, fragment):
    raw = pod([("a", "2")])
    mutate(raw)
    with pytest.raises(PodSpecError) as e:
        PodInfo.from_pod(raw)
    assert fragment in str(e.value)


def test_intent_round_trip_and_errors():
    p = PodInfo.from_pod(pod([("a", "2")], init=[("s", "1", "1Gi", True, "Always")],
                             annotations={"qos.gocrane.io/cpu-manager": "exclusive"}))
    text = encode_intent(p)
    back = decode_intent(text, uid="u1", namespace="ns", name="p", annotations={})
    assert back == p
    for bad, frag in [("{", "not JSON"), ('{"v": 2}', "version"),
                      (text.replace('"app"', '"main"'), "role"), (text.replace("2000", "-1"), "cpu")]:
        with pytest.raises(PodSpecError) as e:
            decode_intent(bad, uid="u", namespace="ns", name="p")
        assert frag in str(e.value) and INTENT_ANNOTATION in str(e.value)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 8000), st.integers(0, 8000), st.booleans()), min_size=1, max_size=5),
       st.sampled_from([None, "none", "exclusive", "share"]))
def test_intent_round_trip_property(specs, mode):
    containers, inits = [], []
    for i, (req, lim, init) in enumerate(specs):
        d = {"name": f"c{i}", "resources": {"requests": {"cpu": f"{req}m"}, "limits": {"cpu": f"{max(req, lim)}m"}}}
        (inits if init and i else containers).append(d)
    raw = {"metadata": {"uid": "u", "name": "p", "namespace": "n",
                        "annotations": {"qos.gocrane.io/cpu-manager": mode} if mode else {}},
           "spec": {"containers": containers, "initContainers": inits}}
    p = PodInfo.from_pod(raw)
    assert decode_intent(encode_intent(p), uid="u", namespace="n", name="p") == p
