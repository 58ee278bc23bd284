"""matplotlib's default backend in the sandbox (MPLBACKEND=module://exec_sandbox_guest.mpl_backend,
set in the clean environment of user code): figures become image/png outputs for the host.

Rendering is Agg's (no display in the VM). `plt.show()` sends every open figure and closes them;
`Figure.show()` sends that figure and closes it. Figures the code leaves open are sent by
`flush_figures()`: the python session driver calls it after each exec, and a one-shot run calls it
at its end (registered with atexit when this backend is loaded), so that a plot the code made but
never showed is not lost, as in a notebook.
"""

import atexit
import sys

import matplotlib
from matplotlib._pylab_helpers import Gcf
from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

from ._display import _figure_png, send

BACKEND = "module://" + __name__


def _send_figure(fig: object) -> None:
    send("image/png", _figure_png(fig))


class FigureManager(FigureManagerBase):
    def show(self) -> None:
        # Figure.show(): this one figure, now.
        _send_figure(self.canvas.figure)
        Gcf.destroy(self)


class FigureCanvas(FigureCanvasAgg):
    manager_class = FigureManager  # type: ignore[assignment]


def show(*args: object, **kwargs: object) -> None:
    """pyplot.show(): every open figure to the host as image/png, then closed. `block` and the
    other options of interactive backends mean nothing here."""
    try:
        for manager in Gcf.get_all_fig_managers():
            _send_figure(manager.canvas.figure)
    finally:
        Gcf.destroy_all()


def flush_figures() -> None:
    """Send and close the figures still open, if this backend is pyplot's; never raises (a
    figure that fails to render is reported on stderr)."""
    try:
        if matplotlib.get_backend() != BACKEND:
            return  # the code chose another backend: its figures are its own business
        managers = Gcf.get_all_fig_managers()
    except Exception:
        return
    for manager in managers:
        try:
            _send_figure(manager.canvas.figure)
        except Exception:
            import traceback

            print("exec-sandbox: a figure could not be rendered:", file=sys.stderr)
            traceback.print_exc()
    try:
        Gcf.destroy_all()
    except Exception:
        pass


atexit.register(flush_figures)
