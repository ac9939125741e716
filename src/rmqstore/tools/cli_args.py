"""The command line's argument parser: argparse's, with errors that name only what is wrong.

argparse lets a subcommand's parser collect what it does not know and hands it to the top-level parser,
which then prints the top-level usage and "unrecognized arguments: --flsh STORE": the misspelt option and
whatever that pushed out of place (the store path, taken as the option's value). CommandParser looks at
every option of its command before parsing: an unknown one fails at once with that command's usage, naming
only the option, and the option it most resembles (`--flsh` -> `--flush`), as pip and git do; a misspelt
command gets its near match too. Subparsers inherit the class (argparse's add_subparsers default).
"""
from __future__ import annotations

import argparse
import difflib
import sys


def near(word: str, candidates, cutoff: float = 0.6) -> str | None:
    """The candidate most like word (difflib's ratio, at least cutoff), or None."""
    got = difflib.get_close_matches(word, list(candidates), n=1, cutoff=cutoff)
    return got[0] if got else None


class CommandParser(argparse.ArgumentParser):
    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        self._check_options(args)
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and not self._has_commands():      # a command's extra arguments: its own usage names them
            self.error(f"unrecognized arguments: {' '.join(extras)} (see {self.prog} --help)")
        return namespace, extras

    def _has_commands(self) -> bool:
        return any(isinstance(a, argparse._SubParsersAction) for a in self._actions)

    def _check_options(self, args: list[str]) -> None:
        """self.error (usage, one line, exit 2) for the first option-like argument no option of this parser
        takes; arguments after `--`, values of known options and (for a parser with subcommands) everything
        from the subcommand on are left to argparse."""
        has_commands = self._has_commands()
        i = 0
        while i < len(args):
            tok = args[i]
            i += 1
            if tok == "--":
                return
            got = self._parse_optional(tok)
            if isinstance(got, list):          # Python 3.12.7+: a list of (action, option, sep, value)
                got = got[0] if len(got) == 1 else None
            if got is None:                    # a positional argument (or a negative number)
                if has_commands:
                    return
                continue
            action, explicit = got[0], got[-1]
            if action is None:
                self.error(self._unknown_option(tok))
            i += self._values_taken(action, explicit, args[i:])

    def _unknown_option(self, tok: str) -> str:
        name = tok.split("=", 1)[0]
        options = [o for o in self._option_string_actions if o.startswith("--")] if name.startswith("--") \
            else list(self._option_string_actions)
        match = near(name, options)
        hint = f" (did you mean {match}?)" if match else f" (see {self.prog} --help)"
        return f"unrecognized option {name}{hint}"

    def _values_taken(self, action: argparse.Action, explicit, rest: list[str]) -> int:
        """How many of the following arguments the option takes as its values."""
        if explicit is not None or action.nargs == 0:
            return 0
        if action.nargs is None:
            return 1 if rest else 0
        if isinstance(action.nargs, int):
            return min(action.nargs, len(rest))
        n = 0                                   # ?, *, +: up to the next option-like argument
        while n < len(rest) and not rest[n].startswith(tuple(self.prefix_chars)):
            n += 1
            if action.nargs == "?":
                break
        return n

    def _check_value(self, action: argparse.Action, value) -> None:
        """argparse's check of a choice, with the near match of a misspelt one (a command, --flush's mode)."""
        if action.choices is not None and value not in action.choices and isinstance(value, str):
            match = near(value, [c for c in action.choices if isinstance(c, str)])
            if match:
                choices = ", ".join(repr(c) for c in action.choices)
                raise argparse.ArgumentError(action, f"invalid choice: {value!r}, did you mean {match!r}? "
                                                     f"(choose from {choices})")
        super()._check_value(action, value)
