"""The async API written once: each member of a twin class names the sync member it
forwards, and its signature, return type and docstring are that member's.

``AsyncSessions.create = coroutine(Sessions.create)`` is the whole declaration: the
type checker reads the parameters and the return type from ``Sessions.create``
through a ``ParamSpec`` (so a user's ``await store.sessions.create(titel=...)``
fails ``mypy --strict``), and at class creation the declaration is replaced by a
real ``async def`` whose ``__signature__`` and ``__doc__`` are the sync method's
(``help()``, ``inspect``).  Before, ``store/aio.py`` copied 60 signatures and
docstrings by hand and a test compared the copies (issue 26); docs/design.md,
"The async API", says why this and not a generator.

The kinds of member:

* ``coroutine(fn)``: the call runs in the twin's pool (``Twin._run``), awaited;
* ``plain(fn)``: no I/O, so called on the loop and returned as it is;
* either with ``then=``: the result converted (a ``Stream`` into an ``AsyncStream``);
* ``attribute(Cls, lambda x: x.name)``: a read-only property of the sync object;
* ``implements(fn)``: a hand-written body given the sync member's type and docs.

A declaration names its sync member twice (``create = coroutine(Sessions.create)``);
a mismatch fails at import (``TypeError``), so a wrong target cannot ship.
"""

from __future__ import annotations

import asyncio
import inspect
import typing
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, Concatenate, Generic, ParamSpec, TypeVar, overload

P = ParamSpec("P")
R = TypeVar("R")
R2 = TypeVar("R2")
S = TypeVar("S")
T = TypeVar("T")

_Then = Callable[[Any, Any], Any]


class _Forward(Generic[P, R]):
    """A declared member, replaced by a real function when its class is created.

    The type checker sees this class's ``__get__``: ``Callable[P, R]`` on an instance."""

    def __init__(self, kind: str, fn: Callable[..., Any], then: _Then | None = None) -> None:
        self.kind = kind
        self.fn = fn
        self.then = then
        self.body: Callable[..., Any] | None = None  # implements(): the hand-written body

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> Callable[Concatenate[Any, P], R]: ...
    @overload
    def __get__(self, obj: object, owner: type[Any]) -> Callable[P, R]: ...
    def __get__(self, obj: object, owner: type[Any]) -> Any:
        raise AssertionError("replaced by Twin.__init_subclass__")  # pragma: no cover

    def build(self, owner: type, name: str) -> Callable[..., Any]:
        target = getattr(self.fn, "__name__", None)
        if target != name:
            raise TypeError(f"{owner.__name__}.{name} forwards {self.fn.__qualname__}")
        sync = inspect.signature(self.fn)
        returns = sync.return_annotation
        if self.then is not None:
            returns = inspect.signature(self.then).return_annotation
        method = self.body if self.body is not None else _bodies[self.kind](name, self.then)
        method.__name__ = name
        method.__qualname__ = f"{owner.__qualname__}.{name}"
        method.__module__ = owner.__module__
        method.__signature__ = sync.replace(return_annotation=returns)  # type: ignore[attr-defined]
        # The async side's own words (what differs), after the sync member's.
        notes = [inspect.getdoc(f) for f in (self.body, self.then) if f is not None]
        method.__doc__ = "\n\n".join(d for d in [inspect.getdoc(self.fn), *notes] if d) or None
        return method


def _coroutine_body(name: str, then: _Then | None) -> Callable[..., Any]:
    async def method(self: Twin[Any], *args: Any, **kwargs: Any) -> Any:
        call = getattr(self.sync, name)
        result = await self._run(lambda: call(*args, **kwargs))
        return result if then is None else then(self, result)

    return method


def _plain_body(name: str, then: _Then | None) -> Callable[..., Any]:
    def method(self: Twin[Any], *args: Any, **kwargs: Any) -> Any:
        result = getattr(self.sync, name)(*args, **kwargs)
        return result if then is None else then(self, result)

    return method


_bodies = {"coroutine": _coroutine_body, "plain": _plain_body}


@overload
def coroutine(
    fn: Callable[Concatenate[Any, P], R],
) -> _Forward[P, Coroutine[Any, Any, R]]: ...
@overload
def coroutine(
    fn: Callable[Concatenate[Any, P], R], *, then: Callable[[Any, R], R2]
) -> _Forward[P, Coroutine[Any, Any, R2]]: ...
def coroutine(fn: Callable[..., Any], *, then: _Then | None = None) -> _Forward[..., Any]:
    """The sync method *fn*, run in the twin's pool and awaited; *then* converts its
    result (called on the loop with the twin and the result; its docstring, if any,
    is appended to *fn*'s)."""
    return _Forward("coroutine", fn, then)


@overload
def plain(fn: Callable[Concatenate[Any, P], R]) -> _Forward[P, R]: ...
@overload
def plain(
    fn: Callable[Concatenate[Any, P], R], *, then: Callable[[Any, R], R2]
) -> _Forward[P, R2]: ...
def plain(fn: Callable[..., Any], *, then: _Then | None = None) -> _Forward[..., Any]:
    """The sync method *fn*, called on the loop: it does no I/O (``metrics``,
    ``Stream.usage``), or returns what does it later (``Messages.stream``)."""
    return _Forward("plain", fn, then)


def implements(
    fn: Callable[Concatenate[Any, P], R],
) -> Callable[[Callable[..., Coroutine[Any, Any, R]]], _Forward[P, Coroutine[Any, Any, R]]]:
    """A hand-written coroutine for *fn* (it waits for something first, or decides
    what runs on the loop).  Its parameters must be *fn*'s, or ``(self, *args,
    **kwargs)`` passed on; checked at import, and its docstring is appended."""

    def declare(body: Callable[..., Coroutine[Any, Any, R]]) -> _Forward[P, Coroutine[Any, Any, R]]:
        mine = list(inspect.signature(body).parameters.values())
        theirs = list(inspect.signature(fn).parameters.values())
        passes_on = [p.kind for p in mine[1:]] == [
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ]
        same = [(p.name, p.kind, p.default) for p in mine] == [
            (p.name, p.kind, p.default) for p in theirs
        ]
        if not (passes_on or same):
            raise TypeError(
                f"{body.__qualname__} does not take the parameters of {fn.__qualname__}"
            )
        forward: _Forward[P, Coroutine[Any, Any, R]] = _Forward("implements", fn)
        forward.body = body
        return forward

    return declare


class _Attribute(Generic[T]):
    """A read-only attribute of the sync object (becomes a ``property``)."""

    def __init__(self, get: Callable[[Any], T]) -> None:
        self.get = get

    @overload
    def __get__(self, obj: None, owner: type[Any]) -> property: ...
    @overload
    def __get__(self, obj: object, owner: type[Any]) -> T: ...
    def __get__(self, obj: object, owner: type[Any]) -> Any:
        raise AssertionError("replaced by Twin.__init_subclass__")  # pragma: no cover

    def build(self, owner: type, name: str) -> property:
        # The getter must read the namesake and nothing else: ``lambda s: s.id``.
        if self.get.__code__.co_names != (name,):
            raise TypeError(f"{owner.__name__}.{name} reads {self.get.__code__.co_names}")
        get = self.get
        return property(lambda twin: get(twin.sync), doc=f"The sync object's ``{name}``.")


def attribute(of: type[S], get: Callable[[S], T]) -> _Attribute[T]:
    """``id = attribute(Stream, lambda s: s.id)``: the sync object's ``id``, typed as
    ``Stream.id`` is (*of* only lets the type checker type the lambda)."""
    return _Attribute(get)


class Twin(Generic[S]):
    """The async twin of one sync object, ``sync``; its calls run through ``_run``.

    Subclass as ``class AsyncX(Twin[X])`` and declare members with the functions
    above; ``forwarded`` then lists every declared member by name."""

    sync: S
    #: The sync class this twin forwards (from ``Twin[X]`` in the class statement).
    sync_type: ClassVar[type]
    #: Declared member -> its kind ("coroutine", "plain", "implements", "attribute").
    forwarded: ClassVar[dict[str, str]] = {}

    def _run(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in vars(cls).get("__orig_bases__", ()):
            args = typing.get_args(base)
            if args and isinstance(args[0], type):
                cls.sync_type = args[0]
        cls.forwarded = dict(cls.forwarded)
        for name, member in list(vars(cls).items()):
            if isinstance(member, _Forward):
                setattr(cls, name, member.build(cls, name))
                cls.forwarded[name] = member.kind
            elif isinstance(member, _Attribute):
                setattr(cls, name, member.build(cls, name))
                cls.forwarded[name] = "attribute"
