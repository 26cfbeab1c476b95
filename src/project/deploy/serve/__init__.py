"""The HTTP prediction service (`python -m project serve`): onnxruntime, FastAPI and uvicorn, no torch.

command.py      flags, socket, uvicorn, clean stop
app.py          routes: /predict, /reload, /health, /metadata, /metrics; errors as JSON
service.py      the running service without HTTP: predict, reload, counters; start and stop
predictions.py  image -> preprocessed -> batch -> answer (top-k, labels)
                (and whether it is `unknown`)  # room: unknown
bodies.py       request body -> checked image, or a 4xx error
body_memory.py  the budget of body and decoded-image memory, and giving it back
batching.py     dynamic batching of concurrent requests
models.py       the served export, its version, reloading without downtime
sampler.py      a bounded sample of requests and answers, to look for drift
"""
