"""The HTTP prediction service (`python -m project serve`): onnxruntime, FastAPI and uvicorn, no torch.

command.py   flags, socket, uvicorn, clean stop
app.py       routes: /predict, /reload, /health, /metadata, /metrics
bodies.py    request body -> checked image, or a 4xx error
batching.py  dynamic batching of concurrent requests
models.py    the served export, its version, reloading without downtime
sampler.py   a bounded sample of requests and answers, to look for drift
"""
