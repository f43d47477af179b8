"""Jinja templates (this folder ships inside the wheel as launcher.templates)."""
