"""Lab 10: the tuning advisor (a deployment's goal to vLLM's settings, each resting on a measurement), and the
lab's steps over the whole road (`journey`) and the advisor as one object.

Modules import one way: latency < plan < load < served < check < lab < checks; record after check.

- `latency`: per-token latency, lab 09's cost model calibrated per batch on lab 06's recorded 8B runs, plus the
  prefill new prompts bring (priced on lab 07's);
- `plan`: the `Goal`, the advice row by row (fit, weights, load, prefix caching, speculation), the config text;
- `load`: the advised engine under the goal's arrivals (lab 04's simulator): TTFT, TPOT and ITL percentiles;
- `served`: the same model replayed on every server the H200 recorded under load (labs 05, 07 and `check`'s):
  predicted against measured without a GPU;
- `check`: the advice run on this GPU under the goal's arrivals, predicted against measured;
- `lab`: the notebook's steps as one object's methods (`JourneyLab`: the whole road, the goals advised);
- `checks`: the notebook's Checks cell, on that object;
- `record`: the GPU recording step(s), which only scripts/record_reference.py calls.
"""
