"""The RPC table: one entry per method of the .proto's service, its models matching its messages."""

from __future__ import annotations

from typing import Any

import pytest

from stratagem.protocol import (
    READ_RPCS,
    ControlRequest,
    ExtractEntitiesRequest,
    ExtractEntitiesResponse,
    ProtocolUsageError,
    RequestEnvelope,
    ResponseEnvelope,
)
from stratagem.protocol._drift import schema_drift
from stratagem.protocol._gen.stratagem.v1 import agent_pb2 as pb
from stratagem.protocol._models import PlanQuery
from stratagem.protocol._service import CALL, CONTROL, RPCS, WATCH, RpcSpec

SERVICE = pb.DESCRIPTOR.services_by_name["AgentService"]


def test_the_table_has_one_entry_per_method_in_proto_order() -> None:
    assert list(RPCS) == [method.name for method in SERVICE.methods]


@pytest.mark.parametrize("spec", RPCS.values(), ids=lambda spec: spec.name)
def test_an_entry_matches_its_method(spec: RpcSpec[Any, Any]) -> None:
    method = SERVICE.methods_by_name[spec.name]
    request, response = spec.messages
    assert method.input_type.full_name == request.DESCRIPTOR.full_name
    assert method.output_type.full_name == response.DESCRIPTOR.full_name
    assert method.server_streaming == spec.streaming
    assert not method.client_streaming
    # Call is answered by the capability's handler (the call pipeline); every other by its own.
    assert (spec.serve is None and spec.stream is None) == (spec is CALL)


@pytest.mark.parametrize("spec", RPCS.values(), ids=lambda spec: spec.name)
def test_an_entrys_models_match_its_messages(spec: RpcSpec[Any, Any]) -> None:
    ignore = {"capability", "body"} if spec is CALL else set()
    assert schema_drift(spec.request, spec.messages[0].DESCRIPTOR, ignore=ignore) == []
    assert schema_drift(spec.response, spec.messages[1].DESCRIPTOR, ignore=ignore) == []


def test_the_read_rpcs_are_the_entries_declared_read() -> None:
    assert READ_RPCS == ("Describe", "Watch", "Plans", "Revisions")
    assert all(RPCS[name].access == "read" for name in READ_RPCS)
    assert {spec.name for spec in RPCS.values() if spec.access == "write"} == {
        "Call",
        "RunPlan",
        "Control",
        "Replay",
    }


def test_authorization_names_the_capability_the_policy_is_asked_about() -> None:
    assert CONTROL.authorization(ControlRequest(plan_id="p", action="pause")) == "Control.pause"
    assert CONTROL.action == "action"
    assert WATCH.authorization(PlanQuery(plan_id="p")) == "Watch"
    assert WATCH.action == ""
    assert not WATCH.queued
    assert CALL.action == "capability"


def test_an_entry_codes_its_messages_both_ways() -> None:
    request = ControlRequest(plan_id="p", action="approve", gate_id="g", rationale="ok")
    assert CONTROL.decode_request(CONTROL.encode_request(request)) == request
    envelope = RequestEnvelope(
        request_id="r-1",
        caller="operator",
        target="perception",
        capability="ExtractEntities",
        body=ExtractEntitiesRequest(text="Mira waits in the hall."),
    )
    # Call's envelopes carry their body in the capability's own oneof field.
    assert CALL.decode_request(CALL.encode_request(envelope)) == envelope
    answer = ResponseEnvelope(
        request_id="r-1",
        responder="perception",
        capability="ExtractEntities",
        body=ExtractEntitiesResponse(world_version=3),
    )
    assert CALL.decode_response(CALL.encode_response(answer)) == answer


def test_a_client_request_that_breaks_its_model_names_the_field() -> None:
    with pytest.raises(ProtocolUsageError, match="invalid Watch request: plan_id"):
        WATCH.build(plan_id="no spaces")
