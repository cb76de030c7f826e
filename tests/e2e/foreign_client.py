"""A client that knows only ``proto/`` and the documented token format (docs/security.md).

Run as a script by ``tests/e2e/test_foreign_client.py``, in a process of its own::

    python foreign_client.py GENERATED_DIR SECRET_FILE ENDPOINTS_JSON

``GENERATED_DIR`` holds the Python code ``grpc_tools.protoc`` generated from ``proto/`` alone.
This file imports no Stratagem module: it mints the JWT with PyJWT from the secret's bytes as
docs/security.md says, calls ``Describe`` on every agent in ``ENDPOINTS_JSON``
(``{role: "host:port"}``) and one capability on each built-in agent, and prints what it got as one
JSON object.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import sys
import time
from pathlib import Path
from typing import Any


def _token(secret: bytes, identity: str) -> str:
    import jwt

    # docs/security.md: the HMAC key is HMAC-SHA256(secret, "stratagem.jwt.hs256.v1"); kid is the
    # first 16 hex characters of SHA-256("stratagem cluster secret id\0" + secret).
    key = hmac.new(secret, b"stratagem.jwt.hs256.v1", hashlib.sha256).digest()
    kid = hashlib.sha256(b"stratagem cluster secret id\0" + secret).hexdigest()[:16]
    now = int(time.time())
    claims = {"sub": identity, "aud": "stratagem", "iat": now, "exp": now + 300}
    return jwt.encode(claims, key, algorithm="HS256", headers={"kid": kid})


def main(generated: Path, secret_file: Path, endpoints: dict[str, str]) -> dict[str, Any]:
    sys.path.insert(0, str(generated))
    import grpc
    from google.protobuf import json_format

    from stratagem.v1 import agent_pb2 as pb

    assert Path(pb.__file__).resolve().is_relative_to(generated.resolve()), pb.__file__
    # docs/security.md: cluster.secret holds the secret's bytes in base64 on one line.
    secret = base64.b64decode(secret_file.read_bytes())
    metadata = (("authorization", f"Bearer {_token(secret, 'operator')}"),)
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
    generated_dir, secret, endpoint_file = (Path(a) for a in sys.argv[1:4])
    print(json.dumps(main(generated_dir, secret, json.loads(endpoint_file.read_text()))))
