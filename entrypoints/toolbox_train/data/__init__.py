"""The training data: datasets loaded (files, saved datasets, mixtures), their format detected,
every row checked before anything is written.

  dataset      load and mix the sources, detect the format, split off eval rows
  rowcheck     what is wrong with one row of text, alpaca or messages (file and line named)
  pref_rows    the rows of the preference objectives (preference, unpaired, prompt)
"""
