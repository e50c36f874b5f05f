"""Tests of genalign.rewards.evaluation (eval-reward)."""
