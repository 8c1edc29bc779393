import mindspore as ms
import numpy as np
from mindspore import Tensor, nn
from support import nets

from quantflow.backends.export import ascend_available, export_air, export_mindir


def test_air_skipped_with_reason_on_cpu(tmp_path):
    status = export_air(nets.randomize(nets.ResidualNet()), (1, 3, 16, 16), tmp_path, "m")
    available, reason = ascend_available()
    if available:  # pragma: no cover - only on an Ascend host
        assert (tmp_path / "m.air").is_file()
    else:
        assert status == {"air": None, "air_skipped": reason} and not (tmp_path / "m.air").exists()
        assert "Ascend backend" in reason


def test_exported_mindir_computes_what_the_network_computes(tmp_path):
    net = nets.randomize(nets.ResidualNet())
    path = export_mindir(net, (1, 3, 16, 16), tmp_path / "sub" / "m.mindir")
    assert path == tmp_path / "sub" / "m.mindir" and path.stat().st_size > 0
    graph = nn.GraphCell(ms.load(str(path)))
    x = np.random.default_rng(0).normal(size=(1, 3, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(graph(Tensor(x)).asnumpy(), net(Tensor(x)).asnumpy(), rtol=1e-4, atol=1e-5)
