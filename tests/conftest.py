"""Shared fixtures: the default model loaded once per test session, both matmul paths, the suite under load;
int8 on a named engine.

Also how the suite shares two cores (`pytest -n 2`, pytest-xdist): every test module stays on one
worker, so its module fixtures (a graded class, a built book, a running server) are made once,
except the modules listed in ``SPREAD``, whose tests are independent and each costs minutes.
"""

import os

import pytest
import torch

from labkit.bench.busy import busy_cores
from labkit.labs.manifest import LABS
from labkit.models.int8_linear import ENGINE_VARIABLE

# Modules whose tests each stand alone (one notebook executed, graded or walked on a stand-in device per test): spread
# over the workers.
SPREAD = {"test_labs_execute.py", "test_grading_labs.py", "test_grading_seeds.py", "test_check_devices.py"}
# Modules that share one fixture through module state: they must run on the same worker.
SAME_WORKER = {"test_book.py": "book", "test_browser_book.py": "book", "test_browser_interactive.py": "book"}
# The costliest work first, so that no worker is handed a long unit at the end while the other has nothing left:
# every module of 20 s or more in CI's junit (the book group about 3½ minutes, a solved lab up to 2¼), the
# costliest first; every other module (each under 15 s) after, to fill the end.
COSTLIEST_FIRST = [
    *SAME_WORKER,
    "test_labs_execute.py",
    "test_grading_seeds.py",
    "test_grading_labs.py",
    "test_check_devices.py",
    "test_gpu_check_script.py",
    "test_browser_lab.py",
    "test_grading_sandbox.py",
    "test_engine_default_model.py",
    "test_grading_shards.py",
    "test_lab8_checks.py",
    "test_serve_round2.py",
    "test_route.py",
    "test_lab10_checks.py",
    "test_spec_sampling.py",
    "test_spec_default_model.py",
    "test_generation.py",
    "test_lab_checks_1_3.py",
    "test_quant.py",
    "test_grading_deadline.py",
    "test_models.py",
]

MATMUL_PATHS = ("prepacked", "plain")
_default_models: dict = {}


def load_default_model(prepack: bool = True):
    """The default model in fp32, loaded once per prepack choice for the whole session."""
    from labkit.models import load_model

    if prepack not in _default_models:
        # fp32 everywhere, so the tolerances against transformers mean the same on CPU and GPU
        _default_models[prepack] = load_model("default", dtype="float32", prepack=prepack)
    return _default_models[prepack]


@pytest.fixture(scope="session")
def default_model():
    return load_default_model()


@pytest.fixture(scope="session", params=MATMUL_PATHS)
def matmul_path(request) -> bool:
    """Run a test on oneDNN's prepacked weights and on plain ``F.linear``; yields ``prepack`` for the model.

    So a CI machine with AVX-512 still proves the plain path, and the other way round. The
    prepacked run is skipped, with the probe's reason, where the fast path cannot run here.
    """
    if request.param == "prepacked":
        from labkit.device import default_device
        from labkit.models import fast_linear

        probed = fast_linear.matmul_path(default_device(), torch.float32)
        if not probed.prepacked:
            pytest.skip(f"the prepacked matmul path cannot run here: {probed.reason}")
    return request.param == "prepacked"


@pytest.fixture(scope="session")
def default_model_on_path(matmul_path):
    """The default model on each matmul path in turn (see ``matmul_path``)."""
    model = load_default_model(prepack=matmul_path)
    assert model.prepacked == matmul_path
    return model


def pytest_report_header(config):
    """The machine at the top of every run, so a failure says where it happened."""
    from labkit.device import cpu_features, cpu_threads, default_device
    from labkit.models.fast_linear import matmul_path

    features = cpu_features()
    cpu = ", ".join(f"{key}={value}" for key, value in features.items())
    paths = ", ".join(
        f"{str(dtype).removeprefix('torch.')}: {matmul_path(torch.device('cpu'), dtype).describe()}"
        for dtype in (torch.float32, torch.bfloat16)
    )
    return [
        f"machine: {cpu}; torch threads {cpu_threads()[0]} ({cpu_threads()[1]})",
        f"torch {torch.__version__}, default device {default_device()}; matmuls {paths}",
    ]


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models' matrices are too small to share out; one torch thread is faster and steadier.

    Use it for a whole module with ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_addoption(parser):
    parser.addoption(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="keep N cores busy with spin loops for the whole run (a machine that is not idle); "
        "CI runs the tests marked `timing` this way",
    )


def pytest_configure(config):
    """Every process registers the labs' markers; the rest is for the process that runs the session (pytest-xdist's
    controller, not a worker).

    xdist hands out work units in the order ``pytest_collection_modifyitems`` sets, not (its default)
    by their number of tests, which put every one-test unit, the solved notebooks, last. With
    ``--busy N``, N spin loops run from before the first test to after the last: N for the whole run,
    however many workers share the machine with them.
    """
    for lab in LABS:  # one marker per lab, from the manifest: `pytest -m lab5`
        config.addinivalue_line("markers", f"{lab.name}: lab {lab.number} ({lab.topic}): its checks and notebooks")
    # int8 runs on torch's own default engine, named, so no test pays for timing every engine's decode steps on the
    # default model (about 27 CPU s where nothing is kept, as in CI): tests/test_int8.py proves that choice with fake
    # timings, and the probe itself on a tiny model.
    if torch.backends.quantized.engine != "none":
        os.environ.setdefault(ENGINE_VARIABLE, torch.backends.quantized.engine)
    if getattr(config, "workerinput", None) is not None:
        return
    config.option.loadscopereorder = False
    if config.getoption("--busy", 0):
        config._busy_spinners = busy_cores(config.getoption("--busy"))
        config._busy_spinners.__enter__()


def pytest_unconfigure(config):
    spinners = getattr(config, "_busy_spinners", None)
    if spinners is not None:
        spinners.__exit__(None, None, None)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist's ``--dist loadgroup``: keep each module on one worker, except ``SPREAD``.

    Runs before xdist reads the groups. The costliest modules go first (``COSTLIEST_FIRST``; xdist
    keeps this order, see ``pytest_configure``), so no worker is left with a long notebook at the end
    while the other waits.
    """
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            name = item.path.name
            if name not in SPREAD:
                item.add_marker(pytest.mark.xdist_group(SAME_WORKER.get(name, name)))
    rank = {name: index for index, name in enumerate(COSTLIEST_FIRST)}
    items.sort(key=lambda item: (rank.get(item.path.name, len(rank)), -solved_cost(item)))


def solved_cost(item) -> int:
    """The manifest's cost of the costliest lab a test is marked with (0 if none): long notebooks start first."""
    return max((lab.solved_seconds for lab in LABS if item.get_closest_marker(lab.name)), default=0)


def pytest_collection_finish(session):
    """Under ``--dist loadgroup`` a worker's test ids must carry their group (``...@group``): if they do not,
    xdist hands out tests one by one and every module fixture is made once per worker, silently."""
    config = session.config
    if getattr(config, "workerinput", None) is None or not config.getvalue("loadgroup"):
        return
    grouped = [item for item in session.items if item.path.name not in SPREAD]
    if grouped and not any("@" in item.nodeid for item in grouped):
        raise pytest.UsageError(
            "pytest-xdist's --dist loadgroup lost the test groups (pytest 9 with xdist 3.8 does this); "
            "install the versions pyproject.toml pins: pip install -e '.[dev]'"
        )
