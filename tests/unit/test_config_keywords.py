"""Settings' keywords and the event-mask forms: the same errors and forms from every door (the constructor,
with_, from_env's keywords, the SLICETRACE_* variables, comm.profiling())."""
from __future__ import annotations

import pickle

import pytest

from slicetrace.config import Settings
from slicetrace.errors import ConfigError


@pytest.mark.parametrize("kw,named", [({"foo": 1}, r"\['foo'\]"),
                                      ({"nchanels": 2}, r"\['nchanels'\] \(did you mean nchanels: nchannels\?\)")])
def test_settings_refuses_an_unknown_keyword_as_with_does(kw, named):
    # Settings is public: Settings(foo=1) raised dataclasses' bare TypeError, with_(foo=1) a ConfigError
    for make in (lambda: Settings(**kw), lambda: Settings().with_(**kw)):
        with pytest.raises(ConfigError, match=rf"^unknown setting\(s\) {named}; known: \[.*'nchannels'.*\]$"):
            make()


def test_settings_refuses_more_positional_arguments_than_fields():
    with pytest.raises(ConfigError, match=r"^Settings takes at most 25 positional arguments \(its fields in order\), "
                                          r"got 26; pass settings by keyword$"):
        Settings(*(["cpu"] * 26))


def test_settings_still_builds_copies_and_pickles():
    s = Settings("null", nchannels=2)
    assert (s.backend, s.nchannels) == ("null", 2)
    assert pickle.loads(pickle.dumps(s)) == s and s.with_(nchannels=3).nchannels == 3
