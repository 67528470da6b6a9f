"""The paper runner: configs -> validated specs -> sweeps of cells -> results files, tables, plots."""
