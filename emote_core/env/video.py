"""Episodes recorded as MP4 files: a gymnasium wrapper over an env that renders ``rgb_array``.

Frames are encoded as they are rendered (imageio with its ffmpeg plug-in, the ``video`` extra), so
a long episode never sits in memory. Files are created exclusively: a file already in the folder
is never written over; the next free name is taken instead.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np

from emote_core.errors import ConfigurationError
from emote_core.utils.dependencies import dependency_error

VIDEO_SUFFIX = ".mp4"


def require_video_writer() -> Any:
    """imageio's v2 API, its ffmpeg plug-in checked (SDL's unused display and audio turned off).

    Raises:
        MissingDependencyError: If imageio or imageio-ffmpeg is not installed.
    """
    for module in ("imageio", "imageio_ffmpeg"):
        try:
            __import__(module)
        except ImportError:
            raise dependency_error("recording video", module) from None
    import imageio.v2

    # pygame (which draws gymnasium's classic-control and Box2D envs) starts SDL's display and
    # audio, which print "error: XDG_RUNTIME_DIR is invalid" and ALSA lines on a machine without
    # them; off-screen frames need neither.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    return imageio.v2


def check_renders_frames(env_id: str) -> None:
    """Refuses an env whose class says it cannot render ``rgb_array`` frames.

    Raises:
        ConfigurationError: Naming the render modes it has.
    """
    from gymnasium.envs.registration import load_env_creator

    entry_point = gymnasium.spec(env_id).entry_point
    creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    modes = (getattr(creator, "metadata", None) or {}).get("render_modes")
    if modes is not None and "rgb_array" not in modes:
        raise ConfigurationError(
            f"env '{env_id}' renders {list(modes)}, not 'rgb_array' frames, so its episodes "
            "cannot be recorded as video; record an env that renders rgb_array"
        )


class EpisodeVideos(gymnasium.Wrapper):
    """Writes each of the first ``episodes`` episodes of an env to its own MP4 file.

    Args:
        env: An env made with ``render_mode="rgb_array"``.
        directory: Where the files go (created when missing).
        episodes: How many episodes to record; later ones are not.
        prefix: File names are ``<prefix>-<n>.mp4``, ``n`` the first number not taken.
        fps: Frames per second (default: the env's ``render_fps``, else 30).
    """

    def __init__(
        self,
        env: gymnasium.Env,
        directory: Path,
        *,
        episodes: int,
        prefix: str = "episode",
        fps: int | None = None,
    ) -> None:
        super().__init__(env)
        self._imageio = require_video_writer()
        if env.render_mode != "rgb_array":
            raise ConfigurationError(
                f"recording video needs an env made with render_mode='rgb_array'; got "
                f"{env.render_mode!r}"
            )
        self._directory = Path(directory)
        self._directory.mkdir(parents=True, exist_ok=True)
        self._episodes = episodes
        self._prefix = prefix
        self._fps = int(fps or (env.metadata or {}).get("render_fps") or 30)
        self._writer: Any = None
        self._path: Path | None = None
        self.files: list[Path] = []
        """The videos written so far, each a whole episode."""

    def reset(self, **kwargs: Any) -> Any:
        result = self.env.reset(**kwargs)
        self._discard()  # an episode cut short by a reset is not a whole episode
        if len(self.files) < self._episodes:
            self._path = self._new_file()
            self._writer = self._imageio.get_writer(
                self._path, format="FFMPEG", mode="I", fps=self._fps, codec="libx264",
                macro_block_size=2, ffmpeg_log_level="error",
            )  # fmt: skip
            self._append()
        return result

    def step(self, action: Any) -> Any:
        result = self.env.step(action)
        if self._writer is not None:
            self._append()
            if result[2] or result[3]:  # terminated or truncated: the episode is whole
                self._writer.close()
                self.files.append(self._path)  # type: ignore[arg-type]
                self._writer, self._path = None, None
        return result

    def close(self) -> None:
        self._discard()
        super().close()

    def _append(self) -> None:
        frame = self.env.render()
        self._writer.append_data(np.asarray(frame, dtype=np.uint8))

    def _new_file(self) -> Path:
        """The first ``<prefix>-<n>.mp4`` not taken, created empty so nobody else takes it."""
        number = 0
        while True:
            path = self._directory / f"{self._prefix}-{number:03d}{VIDEO_SUFFIX}"
            try:
                with path.open("xb"):
                    return path
            except FileExistsError:
                number += 1

    def _discard(self) -> None:
        """Drops the unfinished episode's file, which this wrapper created."""
        if self._writer is None:
            return
        with contextlib.suppress(Exception):
            self._writer.close()
        if self._path is not None:
            self._path.unlink(missing_ok=True)
        self._writer, self._path = None, None


__all__ = ["VIDEO_SUFFIX", "EpisodeVideos", "check_renders_frames", "require_video_writer"]
