"""What every command group shares: the parser that fails in one line, ``--db``, the
engine and connection a command works on, and turning errors into one line on stderr.

Errors are one line and exit status 2, never a traceback: a command raises one of
:data:`ERRORS` (or lets an ``OSError`` about a named file through) and :func:`run`
prints it.
"""

from __future__ import annotations

import argparse
import getpass
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from cli.terminal import one_line
from storage.checkpoint import CheckpointError
from storage.cost import PricesError
from storage.database import DatabaseError, default_url, first_line, open_engine, open_reader, shown_url
from storage.query import QueryError, prepare
from storage.retention import RetentionError
from storage.roles import RoleError
from storage.status import StatusError

PROG = "llm-audit"
EXIT_ERROR = 2
HINT = "pass a working SQLAlchemy URL with --db URL or LLM_AUDIT_DB (e.g. sqlite:///path/audit.db)"
# What a command raises for a failure the user can act on: printed as one line.
ERRORS = (DatabaseError, RetentionError, QueryError, CheckpointError, RoleError, StatusError, PricesError)

MAX_COUNT = 2**63 - 1  # the largest LIMIT and OFFSET a database takes

Command = Callable[[argparse.Namespace], int]


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (argparse prints the usage first)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A value that starts with a minus and a digit is a value, not an option: argparse
        # takes only "-5" and "-.5" so, and answered "--since -1d" with "expected one
        # argument" instead of the option's own error naming the forms it takes.
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def db_option() -> argparse.ArgumentParser:
    """The parent parser of ``--db``, accepted before or after the subcommand: SUPPRESS
    keeps a later parser from overwriting an earlier value with its default."""
    parser = OneLineParser(add_help=False)
    parser.add_argument(
        "--db",
        metavar="URL",
        default=argparse.SUPPRESS,
        help="SQLAlchemy URL of the audit database (default: $LLM_AUDIT_DB, else the proxy's SQLite file)",
    )
    return parser


@dataclass(frozen=True)
class Commands:
    """Where a command group adds its subcommands: a subparsers action and the parents
    every subcommand gets (``--db``)."""

    subparsers: argparse._SubParsersAction
    parents: Sequence[argparse.ArgumentParser] = field(default_factory=tuple)

    def add(
        self,
        name: str,
        run: Command,
        summary: str,
        epilog: str,
        *,
        parents: Sequence[argparse.ArgumentParser] | None = None,
        aliases: Sequence[str] = (),
    ) -> argparse.ArgumentParser:
        """A subcommand's parser, with its help, description and examples, that runs ``run``;
        ``parents`` replaces the default ones (``[]``: a command without ``--db``)."""
        parser = self.subparsers.add_parser(
            name,
            help=summary,
            description=summary[0].upper() + summary[1:] + ".",
            epilog=epilog,
            aliases=aliases,
            parents=list(self.parents if parents is None else parents),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        parser.set_defaults(run=run)
        return parser

    def group(self, name: str, summary: str, epilog: str, title: str) -> Commands:
        """A command of subcommands (``db upgrade``, ...), with the same parents."""
        parser = self.subparsers.add_parser(
            name,
            help=summary,
            description=summary[0].upper() + summary[1:] + ".",
            epilog=epilog,
            parents=list(self.parents),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        subparsers = parser.add_subparsers(title=title, metavar=f"<{title[:-1]}>", required=True)
        return Commands(subparsers, self.parents)


def whole_number(value: str) -> int:
    """A whole number of 0 or more that a database takes as an OFFSET."""
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of 0 or more")
    return _bounded(value, int(value))


def _bounded(value: str, n: int) -> int:
    if n > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"{value!r} is too large (at most {MAX_COUNT})")
    return n


def positive_int(value: str) -> int:
    """A whole number of at least 1 that a database takes as a LIMIT (also ``purge --batch-size``)."""
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive whole number")
    return _bounded(value, n)


def url(args: argparse.Namespace) -> str:
    """The database URL: ``--db``, else ``$LLM_AUDIT_DB``, else the proxy's SQLite file."""
    given = getattr(args, "db", None)
    if given is not None and not given.strip():  # (an unset shell variable: --db "$URL" would read the default)
        raise DatabaseError("--db is empty; give the database's SQLAlchemy URL, or leave --db out for the default")
    return given or default_url()


@contextmanager
def engine(
    args: argparse.Namespace, *, existing: bool = False, migrate: bool = True, create: bool = True
) -> Iterator[Engine]:
    """The engine for ``--db``, disposed afterwards; ``existing``: the command reads or
    changes records already there (list, verify, purge, erase, cost recompute), so a
    missing or empty database is an error (a mistyped path), never a new file; ``create``
    False: neither for a command that only looks (``db current``)."""
    opened = (
        open_reader(url(args), hint=HINT)
        if existing
        else open_engine(url(args), migrate=migrate, create=create, hint=HINT)
    )
    try:
        yield opened
    finally:
        opened.dispose()


@contextmanager
def reading(args: argparse.Namespace) -> Iterator[Connection]:
    """A connection for the query commands; a failure while reading becomes one line."""
    with engine(args, existing=True) as opened:
        try:
            with opened.connect() as conn:
                prepare(conn)
                yield conn
        except SQLAlchemyError as e:
            raise DatabaseError(f"cannot read the audit database {shown_url(opened.url)!r}: {first_line(e)}") from None


def actor() -> str:
    """Who runs a purge or an erasure, for the logs: the OS user name."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (e.g. in a container)
        return f"uid {os.getuid()}"


def warn(message: str) -> None:
    """Print ``message`` as one line on stderr that does not stop the command."""
    print(f"{PROG}: warning: {one_line(message)}", file=sys.stderr)  # (it may quote stored text)


def fail(message: str) -> int:
    """Print ``message`` as the command's one-line error; the exit status to return."""
    print(f"{PROG}: {one_line(message)}", file=sys.stderr)  # (a message may quote stored text: made visible)
    return EXIT_ERROR


def run(args: argparse.Namespace) -> int:
    """Run the parsed command; every failure becomes one line on stderr and an exit status."""
    try:
        return args.run(args)
    except ERRORS as e:
        return fail(str(e))
    except BrokenPipeError:
        # whoever read the output stopped (``| head``): end quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE
    except KeyboardInterrupt:
        fail(f"interrupted{getattr(args, 'interrupted_note', '')}")
        return 130
    except OSError as e:  # a file or folder named on the command line
        return fail(f"{e.strerror or e}{f': {e.filename}' if e.filename else ''}")
    except (ValueError, TypeError, LookupError, OverflowError) as e:
        # Values the schema does not allow (SQLite keeps any text in any column): the
        # database was written by something else. One line, never a traceback.
        check = getattr(args, "unreadable_hint", None) or f"run '{PROG} verify'"  # (verify's own: set_defaults)
        return fail(
            f"a stored value cannot be read ({type(e).__name__}: {_first_line(e)}); the database holds "
            f"data llm-audit did not write: {check}"
        )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]
