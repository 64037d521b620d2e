"""The exception tree (``mdq.errors``) and the CLI's one mapping of it (``mdq.cli.errors``),
by tables of named cases."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from mdq.backends.clusters import BadClustersFile, ClusterLost, UnknownCluster
from mdq.backends.port import PodExists
from mdq.bus.inputs import FetchRefused, FetchUnavailable, InputsFull, NoInputsBucket
from mdq.bus.security.auth import TrustMismatch
from mdq.bus.security.runner_creds import CredsRefused
from mdq.cli.context import NoEndpoint
from mdq.cli.errors import EXIT_CODES, Commands
from mdq.core.control import ControlRefused as CoreControlRefused
from mdq.core.lammps_script import ScriptError
from mdq.core.spec import SpecError
from mdq.core.tenants import JobIdError, TenantNameError
from mdq.errors import (
    Conflict,
    InvalidInput,
    MdqError,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from mdq.sdk import IntakeUnavailable, JobFileError, OperatorOnly, SubmitRefused, WaitTimeout
from mdq.sdk.client import ControlRefused, ControlUnavailable
from mdq.stack import StackError
from mdq.store.roles import RoleError


@pytest.mark.parametrize(
    ("kind", "code", "builtin"),
    [
        pytest.param(MdqError, 1, Exception, id="root"),
        pytest.param(InvalidInput, 2, ValueError, id="invalid-input"),
        pytest.param(Unavailable, 3, Exception, id="unavailable"),
        pytest.param(PermissionDenied, 4, PermissionError, id="permission-denied"),
        pytest.param(NotFound, 5, LookupError, id="not-found"),
        pytest.param(Conflict, 6, Exception, id="conflict"),
    ],
)
def test_each_kind_has_its_exit_code_and_stays_what_python_calls_it(
    kind: type[MdqError], code: int, builtin: type[Exception]
) -> None:
    error = kind("what went wrong", field="jobs[0].steps")
    assert isinstance(error, MdqError) and isinstance(error, builtin)
    assert error.exit_code == code
    assert (error.field, error.message) == ("jobs[0].steps", "what went wrong")
    assert str(error) == "jobs[0].steps: what went wrong"
    assert str(kind("no field")) == "no field" and kind("no field").field == ""


def test_the_exit_codes_are_listed_once_each() -> None:
    codes = [code for code, _ in EXIT_CODES]
    assert codes == sorted(set(codes)) == [0, 1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        pytest.param(SpecError("jobs[0].steps", "must be positive"), InvalidInput, id="spec"),
        pytest.param(JobFileError("jobs", "missing", source="a.yaml"), InvalidInput, id="job-file"),
        pytest.param(SubmitRefused("jobs", "no"), InvalidInput, id="sdk-submit-refused"),
        pytest.param(ControlRefused("priority_class", "no"), InvalidInput, id="sdk-control"),
        pytest.param(CoreControlRefused("labels", "no"), InvalidInput, id="core-control"),
        pytest.param(TenantNameError("bad name"), InvalidInput, id="tenant-name"),
        pytest.param(JobIdError("bad id"), InvalidInput, id="job-id"),
        pytest.param(ScriptError(3, "fix 1 all nve", "refused"), InvalidInput, id="lammps"),
        pytest.param(BadClustersFile("bad file"), InvalidInput, id="clusters-file"),
        pytest.param(TrustMismatch("another trust"), InvalidInput, id="trust"),
        pytest.param(IntakeUnavailable("nobody"), Unavailable, id="intake-away"),
        pytest.param(ControlUnavailable("nobody"), Unavailable, id="placement-away"),
        pytest.param(NoEndpoint("no database"), Unavailable, id="no-endpoint"),
        pytest.param(StackError("no stack"), Unavailable, id="stack"),
        pytest.param(ClusterLost("lab1"), Unavailable, id="cluster-lost"),
        pytest.param(InputsFull("full"), Unavailable, id="inputs-full"),
        pytest.param(FetchUnavailable("later"), Unavailable, id="fetch-later"),
        pytest.param(OperatorOnly("operator's"), PermissionDenied, id="operator-only"),
        pytest.param(CredsRefused("no"), PermissionDenied, id="runner-creds"),
        pytest.param(FetchRefused("no"), PermissionDenied, id="fetch-refused"),
        pytest.param(UnknownCluster("lab9"), NotFound, id="unknown-cluster"),
        pytest.param(NoInputsBucket("none"), NotFound, id="no-inputs-bucket"),
        pytest.param(PodExists("mdq-x-1"), Conflict, id="pod-exists"),
        pytest.param(RoleError("no role"), MdqError, id="roles"),
        pytest.param(WaitTimeout("gave up", states={}), MdqError, id="wait-timeout"),
    ],
)
def test_every_error_mdq_raises_on_purpose_has_its_kind(
    error: MdqError, kind: type[MdqError]
) -> None:
    assert isinstance(error, kind)
    assert error.exit_code == kind.exit_code


def _app_raising(error: BaseException) -> typer.Typer:
    app = typer.Typer(cls=Commands)

    @app.command()
    def submit() -> None:
        raise error

    @app.command()
    def other() -> None:  # two commands: the group, as mdq's, dispatches by name
        pass

    return app


@pytest.mark.parametrize(
    ("error", "code", "said"),
    [
        pytest.param(
            SpecError("jobs[0].steps", "must be positive"),
            2,
            ["submit refused", "field:   jobs[0].steps", "message: must be positive"],
            id="a-refusal-names-its-field",
        ),
        pytest.param(
            JobFileError("jobs", "missing", source="a.yaml"),
            2,
            ["submit refused", "field:   jobs", "message: a.yaml: missing"],
            id="a-file-refusal-names-the-file",
        ),
        pytest.param(
            TenantNameError("'Bob' is not a tenant name"),
            2,
            ["'Bob' is not a tenant name"],
            id="a-refusal-without-field-is-its-text",
        ),
        pytest.param(IntakeUnavailable("is intake running?"), 3, ["is intake running?"], id="away"),
        pytest.param(OperatorOnly("may not"), 4, ["may not"], id="denied"),
        pytest.param(UnknownCluster("no cluster lab9"), 5, ["no cluster lab9"], id="not-found"),
        pytest.param(PodExists("pod mdq-x-1 exists"), 6, ["pod mdq-x-1 exists"], id="conflict"),
    ],
)
def test_the_cli_says_each_error_and_exits_with_its_code(
    error: MdqError, code: int, said: list[str]
) -> None:
    result = CliRunner().invoke(_app_raising(error), ["submit"])
    assert result.exit_code == code, result.output
    for text in said:
        assert text in result.stderr, result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.output


def test_an_error_that_is_not_mdqs_is_not_hidden() -> None:
    result = CliRunner().invoke(_app_raising(ZeroDivisionError("a bug")), ["submit"])
    assert isinstance(result.exception, ZeroDivisionError)
