"""The one check of a recipe: whatever the driver would refuse, every command refuses first.

recipe.py  check_recipe / validate_recipe: every problem of a recipe, and what each command refuses
ranges.py  every number in its range, every enumeration one of its values
files.py   what is read from this machine: paths, end ids, prompt lengths
seal.py    the launcher's check carried to the ranks, which then skip reading the problem set again
"""
