"""The page `serve` answers GET / with: pick or drop an image, see what the model answers.

One self-contained HTML document (inline CSS and script, no external script, font or image), so
it works offline and behind any reverse proxy: it calls the service's JSON routes by relative
URLs (`predict`, `metadata`), shows the top classes with their probabilities,
calibrated by the export's temperature,  # room: calibration
the `unknown` verdict with its reason,  # room: unknown
and the model version. Everything the service returns is
inserted with `textContent`, never as HTML: a class name is data (an export may name a class
`<img src=x onerror=...>`). The Content-Security-Policy in HEADERS allows only this page's own
script (by its hash) and requests to its own origin, so even markup that got in could not run.
It knows nothing of the routes' code: app.py serves it.
"""

from __future__ import annotations

import base64
import hashlib

SCRIPT = """
"use strict";
const $ = (id) => document.getElementById(id);
const text = (tag, value, cls) => {  // every value from the service goes in as text, never as HTML
  const node = document.createElement(tag);
  node.textContent = value;
  if (cls) node.className = cls;
  return node;
};
const percent = (p) => (100 * p).toFixed(1) + "%";

async function json(response) {
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || response.status + " " + response.statusText);
  return body;
}

async function showVersion() {
  try {
    const meta = await json(await fetch("metadata"));
    $("version").textContent = "model " + meta.version + " \\u00b7 " + meta.class_names.length + " classes";
  } catch (e) {
    $("version").textContent = "model metadata unavailable: " + e.message;
  }
}

function showAnswer(answer) {
  const verdict = $("verdict");
  verdict.replaceChildren();
  const unknown = answer.class_name === "unknown";
  verdict.className = unknown ? "verdict unknown" : "verdict";
  verdict.append(text("strong", answer.class_name ?? answer.predictions[0].class_name, "answer"));
  if (unknown && answer.unknown && answer.unknown.reason) {
    verdict.append(text("span", " because its " + answer.unknown.reason + ".", "reason"));
  }
  if (answer.labels) verdict.append(text("span", " labels: " + (answer.labels.join(", ") || "none")));
  const rows = answer.predictions.map((p) => {
    const row = document.createElement("tr");
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.style.width = percent(p.probability);
    const cell = document.createElement("td");
    cell.className = "barcell";
    cell.append(bar);
    row.append(text("td", p.class_name, "name"), text("td", percent(p.probability), "prob"), cell);
    return row;
  });
  $("classes").replaceChildren(...rows);
  $("answered-by").textContent = "answered by " + answer.version;
}

async function classify(file) {
  if (!file) return;
  $("status").textContent = "classifying " + file.name + " ...";
  $("preview").src = URL.createObjectURL(file);
  $("preview").hidden = false;
  const form = new FormData();
  form.append("file", file);
  try {
    showAnswer(await json(await fetch("predict", { method: "POST", body: form })));
    $("status").textContent = file.name;
  } catch (e) {
    $("status").textContent = "error: " + e.message;
  }
}

$("file").addEventListener("change", (e) => classify(e.target.files[0]));
const drop = $("drop");
drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (e) => {
  e.preventDefault();
  drop.classList.remove("over");
  classify(e.dataTransfer.files[0]);
});
showVersion();
"""

STYLE = """
body { font: 15px/1.4 system-ui, sans-serif; max-width: 44rem; margin: 2rem auto; padding: 0 1rem;
       color: #222; }
h1 { font-size: 1.3rem; margin-bottom: 0.2rem; }
#version, #answered-by, #status { color: #666; font-size: 0.85rem; }
#drop { display: block; border: 2px dashed #aaa; border-radius: 8px; padding: 1.5rem; text-align: center;
        margin: 1rem 0; }
#drop.over { border-color: #2a6fdb; background: #eef4ff; }
#preview { width: 8rem; display: block; margin: 0.5rem auto; image-rendering: pixelated; }
#preview[hidden] { display: none; }
.verdict { font-size: 1.1rem; margin: 1rem 0 0.5rem; }
.verdict.unknown .answer { color: #b3261e; }
.reason { color: #444; font-size: 0.95rem; }
table { border-collapse: collapse; width: 100%; }
td { padding: 0.2rem 0.4rem; }
td.name { word-break: break-all; }
td.prob { text-align: right; font-variant-numeric: tabular-nums; width: 4rem; }
td.barcell { width: 45%; }
.bar { background: #2a6fdb; height: 0.8rem; border-radius: 2px; min-width: 1px; }
"""

HTML = f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Try the model</title>
<style>{STYLE}</style>
</head>
<body>
<h1>Try the model</h1>
<div id="version">model ...</div>
<label id="drop">Drop an image here, or pick one:
  <input id="file" type="file" accept="image/*">
</label>
<img id="preview" alt="the image sent" hidden>
<div id="status"></div>
<div id="verdict" class="verdict"></div>
<table><tbody id="classes"></tbody></table>
<div id="answered-by"></div>
<script>{SCRIPT}</script>
</body>
</html>
"""


def _sha256(source: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode()


# only this page's own script and style run; it may fetch from its own origin and show the picked
# file (a blob: URL); no other source of anything
HEADERS = {
    "Content-Security-Policy": (
        f"default-src 'none'; script-src '{_sha256(SCRIPT)}'; style-src '{_sha256(STYLE)}'; "
        "connect-src 'self'; img-src blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}
