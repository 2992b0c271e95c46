"""Many requests on one machine: workloads, engines, vLLM's metrics, and one serving run.

    from explorer.serving import Workload, serve
    res = serve(lm, Workload(num_prompts=32, input_len=32, output_len=32), engine="continuous")
    print(format_summary(res))          # the table vllm bench serve prints

Rooms: workload (who asks what, when), metrics (per-request records, vLLM definitions),
engines/ (sequential, static, continuous, http), run (one run -> ServingResult).
"""

from explorer.serving.engines import NAMES as ENGINES
from explorer.serving.engines import Iteration
from explorer.serving.metrics import RequestRecord, parse_goodput, summarise
from explorer.serving.run import ServingResult, serve
from explorer.serving.summary import format_summary
from explorer.serving.workload import Request, Workload, WorkloadError, save_requests

__all__ = [
    "ENGINES",
    "Iteration",
    "Request",
    "RequestRecord",
    "ServingResult",
    "Workload",
    "WorkloadError",
    "format_summary",
    "parse_goodput",
    "save_requests",
    "serve",
    "summarise",
]
