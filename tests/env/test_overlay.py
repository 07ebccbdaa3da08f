"""A container's changes read from its overlay2 layers on this host equal the daemon's own ``docker diff``."""

import time

import pytest

from rsi_jax.env.overlay import KIND_ADDED, KIND_DELETED, KIND_MODIFIED, overlay_changes
from rsi_jax.env.sandbox import CONTAINER_DIED, DockerSandbox, SandboxError

# Every kind of change an agent can make: files and folders added (also under new folders), files changed in
# content or only in mode, files and whole folders deleted (whiteouts), a folder deleted and made again (an
# opaque folder), a file renamed, links and a FIFO added, a program put in front of one on the PATH, a
# folder whose time alone changed, and byte-code beside a module.
_CHANGES = r"""
set -e
echo new > /tmp/new
mkdir -p /opt/newdir/sub && echo f > /opt/newdir/sub/f
echo more >> /etc/debian_version
chmod 600 /etc/shells
rm /etc/issue.net
rm -rf /usr/share/doc/bash
rm -rf /etc/apt/apt.conf.d && mkdir /etc/apt/apt.conf.d && echo x > /etc/apt/apt.conf.d/99x
mv /etc/motd /etc/motd2
ln -s /nonexistent /tmp/dangling
ln -s /bin/true /usr/local/bin/ls
mkfifo /tmp/fifo
touch -d '2001-01-01' /srv
touch -d '2001-01-01' /etc/host.conf
rm /etc/issue && mkdir /etc/issue && echo y > /etc/issue/y
rm -rf /etc/skel && echo z > /etc/skel
mkdir -p /usr/lib/python3/dist-packages/__pycache__ && echo b > /usr/lib/python3/dist-packages/__pycache__/m.pyc
"""


def _key(changes):
  return sorted((c["Path"], c["Kind"]) for c in changes)


def test_changes_read_here_equal_the_daemons_diff(docker_client, run_id):
  with DockerSandbox(docker_client, "rsi-base", run_id=run_id, task_name="overlay") as b:
    r = b.run(_CHANGES)
    assert r.exit_code == 0, r.output
    t0 = time.perf_counter()
    here = b.changes()
    t_here = time.perf_counter() - t0
    assert b._layers, "the tests' daemon runs on this host with overlay2: the layers must be read here"
    t0 = time.perf_counter()
    daemon = b.container.diff()
    t_daemon = time.perf_counter() - t0
    assert _key(here) == _key(daemon)
    assert len(here) == len(daemon)  # nothing listed twice
    kinds = dict(_key(here))
    # the reference itself covers what the check needs (a diff that missed them would make the test weak)
    assert kinds["/tmp/new"] == KIND_ADDED and kinds["/opt/newdir/sub/f"] == KIND_ADDED
    assert kinds["/etc/debian_version"] == KIND_MODIFIED and kinds["/etc/shells"] == KIND_MODIFIED
    assert kinds["/etc/issue.net"] == KIND_DELETED and kinds["/usr/share/doc/bash"] == KIND_DELETED
    # made again (opaque): the folder is modified, what the image had in it deleted, the new file added
    assert kinds["/etc/apt/apt.conf.d"] == KIND_MODIFIED and kinds["/etc/apt/apt.conf.d/99x"] == KIND_ADDED
    assert any(p.startswith("/etc/apt/apt.conf.d/") and k == KIND_DELETED for p, k in kinds.items())
    assert kinds["/etc/motd"] == KIND_DELETED and kinds["/etc/motd2"] == KIND_ADDED
    assert kinds["/usr/local/bin/ls"] == KIND_ADDED and kinds["/etc/host.conf"] == KIND_MODIFIED
    assert kinds["/etc/issue"] == KIND_MODIFIED and kinds["/etc/issue/y"] == KIND_ADDED and kinds["/etc/skel"] == KIND_MODIFIED
    assert "/srv" not in kinds  # a folder's time alone is not a change to the daemon
    print(f"changes: {len(here)} entries, read here in {t_here * 1e3:.1f} ms, by the daemon in "
          f"{t_daemon * 1e3:.1f} ms")
    # a second round of changes on top (a file added earlier now removed, one more changed)
    assert b.run("rm /tmp/new && echo again >> /etc/shells && rm -rf /opt/newdir").exit_code == 0
    assert _key(b.changes()) == _key(b.container.diff())


def test_a_removed_container_is_a_dead_container_not_an_empty_diff(docker_client, run_id):
  with DockerSandbox(docker_client, "rsi-base", run_id=run_id, task_name="overlay-gone") as b:
    assert b.run("echo x > /tmp/x").exit_code == 0
    layers = b.changes() and b._layers
    assert layers
    b.container.remove(force=True)
    with pytest.raises(FileNotFoundError):
      overlay_changes(*layers)
    with pytest.raises(SandboxError) as e:
      b.changes()
    assert e.value.kind == CONTAINER_DIED


# An image whose own layers delete files and folders (whiteouts) and remake a folder (opaque) below the container:
# the image's side must be read through them.
_LAYERED = b"""FROM rsi-base
RUN rm /etc/issue.net && mkdir -p /opt/a/b && echo 1 > /opt/a/x && echo 2 > /opt/a/b/y
RUN rm -rf /etc/apt/apt.conf.d && mkdir /etc/apt/apt.conf.d && echo k > /etc/apt/apt.conf.d/keep
RUN rm /opt/a/x && rm -rf /usr/share/doc/bash
"""


def test_changes_over_an_image_whose_layers_delete_and_remake(docker_client, run_id):
  import io
  img, _ = docker_client.images.build(fileobj=io.BytesIO(_LAYERED), tag="rsi-test-overlay-layers", rm=True,
                                      network_mode="none")
  with DockerSandbox(docker_client, img.id, run_id=run_id, task_name="overlay-layers") as b:
    cmd = ("echo back > /etc/issue.net && echo again > /opt/a/x && rm /opt/a/b/y && echo n > /opt/a/b/z && "
           "rm /etc/apt/apt.conf.d/keep && mkdir -p /usr/share/doc/bash && rm -rf /etc/apt/apt.conf.d && "
           "mkdir /etc/apt/apt.conf.d")
    assert b.run(cmd).exit_code == 0
    here = _key(b.changes())
    assert b._layers and len(b._layers[1]) >= 4
    assert here == _key(b.container.diff())
    kinds = dict(here)
    assert kinds["/etc/issue.net"] == KIND_ADDED and kinds["/opt/a/x"] == KIND_ADDED  # gone in the image
    assert kinds["/opt/a/b/y"] == KIND_DELETED and kinds["/usr/share/doc/bash"] == KIND_ADDED
    assert kinds["/etc/apt/apt.conf.d/keep"] == KIND_DELETED
