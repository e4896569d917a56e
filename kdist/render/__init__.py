"""Presentation of kdist's reports: rich renderables for terminals, HTML for notebooks, plain text, plots.

Functions here take report objects as they are given (duck typing) and
import no analysis module: the reports call them, never the reverse. Every
user string (variable paths, rule patterns, messages) is escaped before it
reaches rich markup.
"""
