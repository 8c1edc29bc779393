import io

from quantflow import progress as progress_module


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_bar_is_silent_without_a_terminal(monkeypatch):
    monkeypatch.setattr(progress_module.sys, "stderr", io.StringIO())
    with progress_module.progress(10, "x") as bar:
        bar.update(10)
        assert bar.disable


def test_bar_counts_images_per_second_on_a_terminal(monkeypatch):
    term = Terminal()
    monkeypatch.setattr(progress_module.sys, "stderr", term)
    with progress_module.progress(64, "calibration: ranges") as bar:
        assert not bar.disable
        bar.update(32)
        bar.update(32)
        assert bar.n == 64
    assert "calibration: ranges" in term.getvalue() and "img" in term.getvalue()
