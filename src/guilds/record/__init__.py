"""The run record: its tables, its engine, its statements and the Store that runs them."""
