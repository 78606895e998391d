"""Where prompts and problems come from: records in their file formats (sources.py), public sets as
they ship (public.py), records into validated problems (problems.py; the Problem type is reward's),
the bundled set, the synthetic task, and the task that draws a step's prompts (task.py)."""
