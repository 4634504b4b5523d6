"""Thin routes: validate, call one library function, map its errors to status codes."""
