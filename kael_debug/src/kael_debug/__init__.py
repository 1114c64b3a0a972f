"""kael-debug: explain tensors, export autograd graphs, trace backward, catch NaNs, profile ops.

Nothing here runs unless asked: the backward hooks are registered with kael's
plugin manager only while a trace or anomaly detection is on, and the profiler
wraps kernels only inside a ``profile()`` block.
"""

from ._anomaly import detect_anomaly, is_anomaly_enabled, set_anomaly_detection
from ._explain import explain
from ._graph import autograd_graph_dot, render_graph
from ._profiler import OpEvent, Profile, profile
from ._trace import set_backward_trace

__all__ = [
    "explain",
    "autograd_graph_dot",
    "render_graph",
    "set_backward_trace",
    "set_anomaly_detection",
    "detect_anomaly",
    "is_anomaly_enabled",
    "profile",
    "Profile",
    "OpEvent",
]
__version__ = "0.1.0"
