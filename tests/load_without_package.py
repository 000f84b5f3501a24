"""Run as a script by `test_hub_and_pipelines.py`: load saved folders the way a Hub user does, in a process where
`hf_scratch_transformer` cannot be imported, and write what the models compute.

    python load_without_package.py JOBS.pt RESULTS.pt
    python load_without_package.py --run SCRIPT.py

JOBS.pt holds a list of {"folder", "auto_class", "inputs"} and optionally {"pipeline_task", "text"}; RESULTS.pt
gets, per job, the model's first output (logits or last hidden state) and the pipeline's result. With --run, the
script runs instead (a model card's example, say).
"""

import importlib.abc
import runpy
import sys


class _NotInstalled(importlib.abc.MetaPathFinder):
    """Makes the package unimportable, as on a machine where it was never installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "hf_scratch_transformer":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, _NotInstalled())

import torch  # noqa: E402
import transformers  # noqa: E402

try:
    import hf_scratch_transformer  # noqa: F401
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("hf_scratch_transformer is importable: this check would prove nothing")
if sys.argv[1] == "--run":
    runpy.run_path(sys.argv[2], run_name="__main__")
    raise SystemExit(0)

jobs_path, results_path = sys.argv[1:3]

results = []
for job in torch.load(jobs_path):
    model = getattr(transformers, job["auto_class"]).from_pretrained(job["folder"], trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
    with torch.no_grad():
        result = {"class": type(model).__name__, "output": model(**job["inputs"])[0]}
    if "pipeline_task" in job:
        pipe = transformers.pipeline(job["pipeline_task"], model=job["folder"], trust_remote_code=True)
        result["pipeline"] = pipe(job["text"], **job.get("pipeline_kwargs", {}))
    results.append(result)
torch.save(results, results_path)
