"""`localspec serve --keep-history` for real, in a home of the test's own: later requests draft from earlier ones
(losslessly), and a server stopped by SIGTERM (systemd, docker stop, kill) keeps what it served, as with Ctrl-C."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

from typer.testing import CliRunner

from localspec.cli import app
from tests.lossless import checking_model
from tests.test_serve import _lossless, start


def test_a_server_keeping_its_history_drafts_from_it_and_keeps_it_when_terminated(
    model_path: Path, tmp_path: Path
) -> None:
    calibration = Path(os.environ["LOCALSPEC_HOME"]) / "cache" / "calibration"
    if calibration.is_dir():  # the pass costs measured already: not measured again in the test's own home
        shutil.copytree(calibration, tmp_path / "cache" / "calibration")
    home = {"LOCALSPEC_HOME": str(tmp_path), "LOCALSPEC_HISTORY": "memory"}  # the flag wins over the variable
    runs = start("--model", str(model_path), "--parallel", "2", "--ctx", "1024", "--keep-history", env=home)
    server = next(runs)
    client = server.client()
    people = [("Ann Lee", "Rome"), ("Ben Ode", "Lima"), ("Cai Sun", "Kyiv")]
    drafted, answers = [], []
    for name, city in people:  # one after another: each request may draft from the ones before it
        content = f"Reply with only a JSON object with the keys name and city: {name} lives in {city}."
        reply = client.chat.completions.create(model="default", messages=[{"role": "user", "content": content}],
                                               max_tokens=24)
        drafted.append(reply.model_extra["timings"]["draft_n_cache"])  # type: ignore[index]
        plain = client.chat.completions.create(model="default", messages=[{"role": "user", "content": content}],
                                               max_tokens=24, extra_body={"speculation": {"drafter": "none"}})
        answers.append((content, reply.choices[0].message.content, plain.choices[0].message.content))
    assert sum(drafted[1:]) > 0
    model = checking_model(model_path)
    for content, got, want in answers:
        _lossless(model, content, got or "", want or "", chat=True)

    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) == -signal.SIGTERM  # ended by the signal, as supervisors expect, after a clean stop
    runs.close()
    shown = CliRunner().invoke(app, ["cache", "--json"], env={"LOCALSPEC_HOME": str(tmp_path)})
    assert shown.exit_code == 0, shown.output
    histories = json.loads(shown.stdout)["histories"]
    assert len(histories) == 1 and list(histories[0]["scopes"]) == ["server"]
    assert histories[0]["scopes"]["server"]["requests"] >= len(people)  # what it served, kept
