"""A client that knows only ``proto/`` and the documented token format: the token recipe of
``docs/security.md``, as the page gives it.

Run as a script by ``tests/e2e/test_foreign_client.py``, in a process of its own::

    python foreign_client.py GENERATED_DIR OPERATOR_KEY_FILE ENDPOINTS_JSON RECIPE_FILE

``GENERATED_DIR`` holds the Python code ``grpc_tools.protoc`` generated from ``proto/`` alone;
``RECIPE_FILE`` the page's Python block that defines ``operator_token``, extracted from the page
and executed here unchanged. This file imports no Stratagem module: it mints the JWT from the
operator's key file (``STATE_DIR/operator.key``) with the page's ``operator_token``, calls
``Describe`` on every agent in ``ENDPOINTS_JSON`` (``{role: "host:port"}``) and one capability on
each built-in agent, and prints what it got as one JSON object.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any


def _token(key_file: Path, recipe: Path) -> str:
    """A token made by the documented recipe (its ``operator_token``), as written on the page."""
    page = runpy.run_path(str(recipe))
    token: str = page["operator_token"](key_file)
    return token


def main(
    generated: Path, key_file: Path, endpoints: dict[str, str], recipe: Path
) -> dict[str, Any]:
    sys.path.insert(0, str(generated))
    import grpc
    from google.protobuf import json_format

    from stratagem.v1 import agent_pb2 as pb

    assert Path(pb.__file__).resolve().is_relative_to(generated.resolve()), pb.__file__
    metadata = (("authorization", f"Bearer {_token(key_file, recipe)}"),)
    requests = {
        "perception": pb.AgentRequest(
            extract_entities=pb.ExtractEntitiesRequest(text="Mira waits in the courtyard.")
        ),
        "strategic": pb.AgentRequest(
            analyze_narrative=pb.AnalyzeNarrativeRequest(
                text="Mira waits in the courtyard. Mira must not fail."
            )
        ),
        "tactical": pb.AgentRequest(
            plan_execution_sequence=pb.PlanExecutionSequenceRequest(
                beat=pb.Beat(
                    id="beat_1",
                    title="The means",
                    goals=[pb.Relation(subject="mira", predicate="has", object="key")],
                ),
                facts=[
                    pb.Relation(subject=s, predicate=p, object=o)
                    for s, p, o in [
                        ("mira", "at", "courtyard"),
                        ("key", "in", "garden"),
                        ("courtyard", "connected", "garden"),
                    ]
                ],
                max_depth=4,
            )
        ),
        "orchestrator": pb.AgentRequest(
            submit_goal=pb.SubmitGoalRequest(
                goal="Mira recovers the iron key",
                passage=(
                    "Mira waits in the courtyard. The iron key lies in the garden. "
                    "The courtyard opens onto the garden."
                ),
                beats=1,
            )
        ),
    }
    cards: dict[str, Any] = {}
    answers: dict[str, Any] = {}
    for number, (role, endpoint) in enumerate(sorted(endpoints.items()), start=1):
        with grpc.insecure_channel(endpoint) as channel:
            describe = channel.unary_unary(
                "/stratagem.v1.AgentService/Describe",
                request_serializer=pb.DescribeRequest.SerializeToString,
                response_deserializer=pb.AgentCard.FromString,
            )
            card = describe(pb.DescribeRequest(), metadata=metadata, timeout=30)
            cards[role] = {
                "role": card.role,
                "capabilities": [c.name for c in card.capabilities],
            }
            if role not in requests:
                continue
            request = requests[role]
            request.request_id = f"{number:032x}"
            request.caller = "operator"
            request.target = role
            call = channel.unary_unary(
                "/stratagem.v1.AgentService/Call",
                request_serializer=pb.AgentRequest.SerializeToString,
                response_deserializer=pb.AgentResponse.FromString,
            )
            answer = call(request, metadata=metadata, timeout=120)
            answers[role] = {
                "request_id": answer.request_id,
                "body": answer.WhichOneof("body"),
                "value": json_format.MessageToDict(getattr(answer, answer.WhichOneof("body"))),
            }
    wire = _wire_values(pb, metadata, endpoints, cards_of=describe_all(pb, metadata, endpoints))
    loaded = sorted(m for m in sys.modules if m == "stratagem" or m.startswith("stratagem."))
    return {"cards": cards, "answers": answers, "wire": wire, "stratagem_modules": loaded}


def describe_all(pb: Any, metadata: Any, endpoints: dict[str, str]) -> dict[str, Any]:
    """Every capability card of every agent, by capability name."""
    import grpc

    found: dict[str, Any] = {}
    for endpoint in endpoints.values():
        with grpc.insecure_channel(endpoint) as channel:
            describe = channel.unary_unary(
                "/stratagem.v1.AgentService/Describe",
                request_serializer=pb.DescribeRequest.SerializeToString,
                response_deserializer=pb.AgentCard.FromString,
            )
            for card in describe(pb.DescribeRequest(), metadata=metadata, timeout=30).capabilities:
                found[card.name] = card
    return found


def _wire_values(
    pb: Any, metadata: Any, endpoints: dict[str, str], cards_of: dict[str, Any]
) -> dict[str, Any]:
    """The example extension's capabilities with values that are not JSON (when deployed)."""
    if "Appraise" not in cards_of:
        return {}
    import appraisal_pb2  # compiled from examples/extensions/appraisal/appraisal.proto
    import grpc
    from google.protobuf import json_format

    def call(role: str, number: int, extension: Any) -> Any:
        request = pb.AgentRequest(
            request_id=f"{number:032x}", caller="operator", target=role, extension=extension
        )
        with grpc.insecure_channel(endpoints[role]) as channel:
            unary = channel.unary_unary(
                "/stratagem.v1.AgentService/Call",
                request_serializer=pb.AgentRequest.SerializeToString,
                response_deserializer=pb.AgentResponse.FromString,
            )
            return unary(request, metadata=metadata, timeout=60)

    rate = pb.ExtensionBody(capability="RateTension", version="1")
    rate.payload_struct.update({"text": "The storm broke. Run!", "scale": 10})
    rated = call("strategic", 101, rate).extension
    appraise = pb.ExtensionBody(capability="Appraise", version="1")
    appraise.payload_message.Pack(appraisal_pb2.AppraiseRequest(entity_id="mira"))
    answered = call("perception", 102, appraise).extension.payload_message
    appraisal = appraisal_pb2.Appraisal()
    answered.Unpack(appraisal)
    wrong = pb.ExtensionBody(capability="Appraise", version="1")
    wrong.payload_message.Pack(appraisal_pb2.Appraisal(entity_id="mira"))
    try:
        call("perception", 103, wrong)
        wrong_code = "OK"
    except grpc.RpcError as exc:
        wrong_code = exc.code().name
    return {
        "cards": {
            name: {"wire": cards_of[name].wire, "request_type": cards_of[name].request_type}
            for name in ("RateTension", "Appraise")
        },
        "rate_tension": json_format.MessageToDict(rated.payload_struct),
        "appraisal": json_format.MessageToDict(appraisal),
        "appraisal_type": answered.TypeName(),
        "wrong_type": wrong_code,
    }


if __name__ == "__main__":
    generated_dir, key_file, endpoint_file, recipe_file = (Path(a) for a in sys.argv[1:5])
    endpoints = json.loads(endpoint_file.read_text())
    print(json.dumps(main(generated_dir, key_file, endpoints, recipe_file)))
