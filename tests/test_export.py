import mindspore as ms
import numpy as np
from mindspore import Tensor, nn

from quantflow.export import ascend_available, export_models
from test_emulator import small_net


def test_mindir_always_and_air_skipped_with_reason_on_cpu(tmp_path):
    net = small_net(3)
    status = export_models(net, (1, 3, 16, 16), tmp_path, "m")
    assert status["mindir"] == "m.mindir" and (tmp_path / "m.mindir").stat().st_size > 0
    available, reason = ascend_available()
    if available:  # pragma: no cover - only on an Ascend host
        assert (tmp_path / "m.air").is_file()
    else:
        assert status["air"] is None and not (tmp_path / "m.air").exists()
        assert "Ascend backend" in status["air_skipped"] and status["air_skipped"] == reason


def test_exported_mindir_computes_what_the_network_computes(tmp_path):
    net = small_net(4)
    export_models(net, (1, 3, 16, 16), tmp_path, "m")
    graph = nn.GraphCell(ms.load(str(tmp_path / "m.mindir")))
    x = np.random.default_rng(0).normal(size=(1, 3, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(graph(Tensor(x)).asnumpy(), net(Tensor(x)).asnumpy(), rtol=1e-4, atol=1e-5)
