"""The launcher's transformers subprocess (`runner.sweep.hf_check`, `runner.model.hf_class --serve`): one process
answers every question of a launching process, and a server that died, hung or raised never answers wrongly.

Held by real subprocesses: two questions are answered by one process (transformers imported once); a killed
server is started again at the next question, which gets its own answer; a question past the timeout is an
error naming the timeout and its server is killed (a late reply is never read as the next question's); what
transformers raises for a config is that question's error, naming the exception, and the server goes on.
"""

from __future__ import annotations

from runner.sweep import hf_check

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}


def effective(server: hf_check._Transformers, config: dict, keys: list[str]) -> dict:
    return server.ask({"effective": [config, keys]})


def test_one_process_answers_every_question_and_a_killed_one_is_started_again():
    server = hf_check._Transformers()
    first = effective(server, {**LLAMA, "rope_theta": 500000.0}, ["rope_theta"])
    pid = server._process.pid
    second = effective(server, {**LLAMA, "hidden_siz": 64}, ["hidden_siz"])
    assert server._process.pid == pid  # transformers imported once
    assert first["acting"] == ["rope_theta"] and second["acting"] == []  # a legacy key acts, a misspelt one does not
    assert first["effective"]["hidden_size"] == 64
    server._process.kill()
    server._process.wait()
    again = effective(server, {**LLAMA, "hidden_size": 32}, [])
    assert server._process.pid != pid and again["effective"]["hidden_size"] == 32


def test_a_question_past_the_timeout_is_an_error_and_its_server_is_killed(monkeypatch):
    server = hf_check._Transformers()
    monkeypatch.setattr(hf_check, "TIMEOUT_S", 0.001)  # less than the server's import of transformers
    said = server.ask({"facts": "llama"})
    assert said == {"error": "asking transformers took longer than 0.001 s"}
    assert server._process is None  # killed: its reply to this question can never be read as another's
    monkeypatch.setattr(hf_check, "TIMEOUT_S", 300.0)
    facts = server.ask({"facts": "llama"})
    assert facts["known"] and "hidden_size" in facts["keys"]


def test_what_transformers_raises_is_that_questions_error_and_the_server_goes_on():
    server = hf_check._Transformers()
    said = effective(server, {**LLAMA, "layer_types": ["no_such_attention"]}, [])  # transformers' validator raises
    assert said["error"].startswith("transformers could not read it (StrictDataclassClassValidationError: "), said
    assert "layer_types" in said["error"]
    pid = server._process.pid
    assert effective(server, LLAMA, [])["effective"]["num_attention_heads"] == 4 and server._process.pid == pid
