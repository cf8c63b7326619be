"""Stable-Baselines3: ``save_replay_buffer`` pickles read into stored tables
(:func:`~emote_core.integrations.sb3.replay_buffer.read_sb3_replay_buffer`)."""
