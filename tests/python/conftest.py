"""pytest setup: the package from the checkout's python/ and the library from the build
directory unless FDMA_LIBRARY says otherwise; --device picks cpu (default) or cuda."""
import os
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("FDMA_LIBRARY", os.path.join(ROOT, "build", "libfdma.so"))
# A fresh inductor cache per run: inductor's on-disk cache does not key on a custom op's
# schema, so code compiled against an older build's ops would be replayed.
_INDUCTOR_DIR = None
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import tempfile

    _INDUCTOR_DIR = os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="fdma_inductor_")


# Property tests (test_properties.py): a fixed set of 30 examples a test by default, so CI
# reruns the same inputs; `pytest --hypothesis-profile=thorough` draws 1000 fresh ones.
try:
    from hypothesis import HealthCheck, settings

    _quiet = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
    settings.register_profile("ci", max_examples=30, deadline=None, derandomize=True, suppress_health_check=_quiet)
    settings.register_profile("thorough", max_examples=1000, deadline=None, suppress_health_check=_quiet)
    settings.load_profile("ci")
except ImportError:  # pragma: no cover - the property tests skip without hypothesis
    pass


def pytest_unconfigure(config):
    if _INDUCTOR_DIR:
        import shutil

        shutil.rmtree(_INDUCTOR_DIR, ignore_errors=True)


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu", choices=["cpu", "cuda"], help="where the tensors live")


@pytest.fixture
def device(request):
    import torch

    dev = request.config.getoption("--device")
    if dev == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch.device(dev)
