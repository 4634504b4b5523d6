"""Thin routes: validate, call one library function, return; api/errors.py maps library errors to statuses."""
