"""What the CLIs share (agent/runtime.py): the exit code and the one line of what ends a command."""
import errno

import pytest

from agent.runtime import cli_exit_code


class _Stopped(Exception):
    pass


def _disk_full(note=None):
    e = OSError(errno.ENOSPC, "No space left on device", "/runs/x/last.pt")
    if note:
        e.add_note(note)
    raise e


def test_a_full_disk_is_one_line_with_what_the_stage_kept(capsys):
    """train.py, evaluate.py, the DAgger command and the table all end through cli_exit_code."""
    assert cli_exit_code(lambda: _disk_full("epoch 2 is not saved"), _Stopped, stop_signals=False) == 2
    assert capsys.readouterr().err == ("error: no space left on the disk while writing '/runs/x/last.pt'; free some "
                                       "space and run the command again (epoch 2 is not saved)\n")
    quota = OSError(errno.EDQUOT, "Disk quota exceeded")
    assert cli_exit_code(lambda: (_ for _ in ()).throw(quota), _Stopped, stop_signals=False) == 2
    assert capsys.readouterr().err.startswith("error: no space left on the disk; free some space")


def test_other_machine_errors_are_not_hidden():
    with pytest.raises(PermissionError):
        cli_exit_code(lambda: (_ for _ in ()).throw(PermissionError(errno.EACCES, "denied")), _Stopped,
                      stop_signals=False)
